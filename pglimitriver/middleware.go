package pglimitriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// ErrInvalidConfig reports a [Config] that cannot be used; the message
// names the field.
var ErrInvalidConfig = errors.New("pglimitriver: invalid config")

// Config configures a [Middleware]. At least one of Limiter and Semaphore
// is required; every other zero field takes its default.
type Config struct {
	// Limiter, when set, decides each job before it runs: Cost units of
	// its Key.
	Limiter pglimit.Limiter

	// Semaphore, when set, holds a slot of the job's Key while it runs:
	// at most Slots jobs of a key run at once, across every worker. The
	// slot's lease is extended while the job runs, it is released when
	// the job ends, and it returns by itself one TTL after a worker that
	// died took it.
	Semaphore *pglimitsem.Semaphore

	// Key returns a job's key. Defaults to the job's kind: one budget
	// per kind of job.
	Key func(job *rivertype.JobRow) (string, error)

	// Cost returns a job's cost in units of Limiter. Defaults to 1.
	Cost func(job *rivertype.JobRow) (int, error)

	// MaxReserve is how far ahead a job the limits refuse may reserve
	// its units (Limiter.Reserve): units due within MaxReserve are the
	// job's at once, the job is snoozed until they are due, and it runs
	// on them when it comes back, without deciding again: one snooze
	// for its units. Units due later are refused, and the job is snoozed
	// until they would be due within MaxReserve, then reserves them.
	// From 1ms to 1 hour. Defaults to 5 seconds, River's scheduler
	// interval: a shorter snooze leaves the job available, to come back
	// at a fetch (at most River's FetchPollInterval later, 1 s by
	// default), where a longer one waits for the scheduler's next run
	// as well.
	//
	// A job on a reservation starts no earlier than its units are due
	// (it waits in process for any part of the wait River cut short),
	// and as late as River brings it back: in any span W, the jobs of a
	// key start at most Burst + Rate × (W + that lateness) times. Where
	// the starts themselves must keep the limits exactly, set NoReserve.
	MaxReserve time.Duration

	// NoReserve, when true, reserves nothing: a refused job is snoozed
	// until the refusal's RetryAfter and decided again when it comes back.
	// Its start then keeps the limits exactly, however late River brings
	// it back, but the jobs that race for a key are snoozed again and
	// again: about one snooze a job for each unit admitted while it
	// waits. Limits that cannot reserve (Reserve's pglimit.ErrUnsupported:
	// window limits, the Range strategy), and a cost past a GCRA limit's
	// burst (then pglimit.ErrInvalidCost: the job is cancelled), always
	// work this way.
	NoReserve bool

	// SlotSnooze bounds how long a job that finds every slot of its key
	// held is snoozed: the semaphore's hint of when one frees
	// (Slot.RetryAfter), which is the first lease's end until this
	// process has seen a release, is at most this. From 1ms to 1 hour.
	// Defaults to 1 second.
	SlotSnooze time.Duration

	// RefundOnError, when true, gives a job's units back when its work
	// returns an error (a snooze or a cancel among them): only work done
	// counts. Defaults to false: a failed attempt keeps its units, as
	// retrying a job that failed costs the upstream again.
	RefundOnError bool
}

// Middleware is a River worker middleware (rivertype.WorkerMiddleware)
// that limits jobs: add it to river.Config.Middleware, or return it from
// a worker's Middleware for one kind of job. It is also a River plugin
// (rivertype.Plugin), for river.Config.Plugins.
type Middleware struct {
	river.MiddlewareDefaults
	cfg Config

	// allowOnly is set once the Limiter has said it cannot reserve
	// (pglimit.ErrUnsupported): every job is then decided with AllowN.
	allowOnly atomic.Bool
}

// Middleware is a worker middleware and a River plugin.
var (
	_ rivertype.WorkerMiddleware = (*Middleware)(nil)
	_ rivertype.Plugin           = (*Middleware)(nil)
)

// metadataKey is the key of a job's metadata that holds its reservation
// between the snooze that waits for it and the attempt that uses it.
const metadataKey = "pglimitriver_reservation"

// reservation is a job's units, reserved for its attempt Attempt and due
// at Due, on this process's clock: no earlier than the database's.
type reservation struct {
	Attempt int       `json:"attempt"`
	Due     time.Time `json:"due"`
}

// NewMiddleware returns a Middleware of cfg.
func NewMiddleware(cfg *Config) (*Middleware, error) {
	if cfg == nil || cfg.Limiter == nil && cfg.Semaphore == nil {
		return nil, fmt.Errorf("%w: a Limiter or a Semaphore is required", ErrInvalidConfig)
	}
	c := *cfg
	if c.Key == nil {
		c.Key = func(job *rivertype.JobRow) (string, error) { return job.Kind, nil }
	}
	if c.Cost == nil {
		c.Cost = func(*rivertype.JobRow) (int, error) { return 1, nil }
	}
	if c.MaxReserve == 0 {
		c.MaxReserve = 5 * time.Second
	}
	if c.MaxReserve < time.Millisecond || c.MaxReserve > time.Hour {
		return nil, fmt.Errorf("%w: MaxReserve must be from 1ms to 1h, got %s", ErrInvalidConfig, c.MaxReserve)
	}
	if c.SlotSnooze == 0 {
		c.SlotSnooze = time.Second
	}
	if c.SlotSnooze < time.Millisecond || c.SlotSnooze > time.Hour {
		return nil, fmt.Errorf("%w: SlotSnooze must be from 1ms to 1h, got %s", ErrInvalidConfig, c.SlotSnooze)
	}
	return &Middleware{cfg: c}, nil
}

// Work decides job before doInner works it.
//
// A job the limits refuse reserves its units when they are due within
// MaxReserve: it is snoozed until then (river.JobSnooze) and, when it
// comes back in the same attempt, runs on them without deciding again,
// waiting in process for any part of the wait that River's clock cut
// short. A job whose units are due later, or that Config.NoReserve or
// limits that cannot reserve decide with AllowN, is snoozed until the
// refusal's RetryAfter and decided again. A job whose key has every slot
// held is snoozed until a slot may be free. A snooze uses up no attempt.
// A job whose key or cost is not valid is cancelled (river.JobCancel):
// its args would never make them valid. A failure of the database is the
// attempt's error, and River retries it; while it is unavailable, a
// Limiter with a Fallback decides the job in process (AllowN, no
// reservation).
//
// Units reserved for a later time are spent when they are reserved: a
// job cancelled or deleted while it waits for them, one that finds every
// slot of its key held when they come due, and one that runs on them and
// fails (even with RefundOnError) keeps them spent.
//
// The decision returns by ctx's deadline or the limiter's or semaphore's
// Timeout, whichever comes first, plus the time to hear the server's
// error or to give up on the connection (the tests allow 500 ms), even
// while a row is locked, the server stopped or the connection dead; units
// given back when no slot could be had are given back without holding
// the job past its deadline, within the limiter's Timeout. Once doInner
// has run, Work returns after the slot's release: at most twice the
// semaphore's Timeout.
func (m *Middleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	key, err := m.cfg.Key(job)
	if err == nil {
		err = pglimit.ValidateKey(key)
	}
	if err != nil {
		return river.JobCancel(fmt.Errorf("pglimitriver: the job's key: %w", err))
	}
	var d pglimit.Decision
	cost := 0
	if m.cfg.Limiter != nil {
		reserved, err := m.reserved(ctx, job)
		if err != nil {
			return err
		}
		if !reserved {
			if cost, err = m.cfg.Cost(job); err != nil {
				return river.JobCancel(fmt.Errorf("%w: pglimitriver: the job's cost: %w", pglimit.ErrInvalidCost, err))
			}
			switch d, err = m.decide(ctx, key, cost); {
			case errors.Is(err, pglimit.ErrInvalidCost):
				return river.JobCancel(err)
			case err != nil:
				return err
			case !d.Allowed:
				return river.JobSnooze(max(d.RetryAfter, time.Millisecond))
			case d.Delay > 0:
				r := reservation{Attempt: job.Attempt, Due: time.Now().Add(d.Delay)}
				if err := river.MetadataSet(ctx, metadataKey, r); err != nil {
					return err
				}
				return river.JobSnooze(d.Delay)
			}
		}
	}
	// giveBack returns the job's units, when it did no work. It waits for
	// the Refund while ctx lasts; the Refund goes on past it, within the
	// limiter's Timeout, without the job.
	giveBack := func() {
		if !d.Allowed || d.Shadow || d.Fallback {
			return
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = m.cfg.Limiter.Refund(context.WithoutCancel(ctx), d, cost) // false or an error: the units stay spent
		}()
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	if m.cfg.Semaphore != nil {
		release, wait, err := m.hold(ctx, key)
		switch {
		case err != nil:
			giveBack()
			return err
		case release == nil:
			giveBack()
			return river.JobSnooze(min(max(wait, time.Millisecond), m.cfg.SlotSnooze))
		}
		defer release()
	}
	if err := doInner(ctx); err != nil {
		if m.cfg.RefundOnError {
			giveBack()
		}
		return err
	}
	return nil
}

// decide takes cost units of key for a job: now, or reserved for when
// they are due within MaxReserve (Decision.Delay), unless the Limiter
// cannot reserve or Config.NoReserve says not to. A cost past a GCRA
// limit's burst is AllowN's to refuse (pglimit.ErrInvalidCost): no
// reservation lets a job take more units at once than the burst. While
// the database is unavailable, AllowN decides: in process, where the
// Limiter has a Fallback (Reserve has none).
func (m *Middleware) decide(ctx context.Context, key string, cost int) (pglimit.Decision, error) {
	fits := !slices.ContainsFunc(m.cfg.Limiter.Policy().Limits, func(l pglimit.Limit) bool {
		return l.Algorithm == pglimit.GCRA && cost > l.Burst
	})
	if fits && !m.cfg.NoReserve && !m.allowOnly.Load() {
		d, err := m.cfg.Limiter.Reserve(ctx, key, cost, m.cfg.MaxReserve)
		switch {
		case errors.Is(err, pglimit.ErrUnsupported):
			m.allowOnly.Store(true)
		case ctx.Err() == nil && (errors.Is(err, pglimit.ErrUnavailable) || errors.Is(err, pglimit.ErrTimeout) || errors.Is(err, pglimit.ErrReadOnly)):
		default:
			return d, err
		}
	}
	return m.cfg.Limiter.AllowN(ctx, key, cost)
}

// reserved reports whether job comes back to units it reserved in this
// attempt, and waits until they are due. It clears the reservation, so
// that a later snooze of the attempt (for a slot) or its retry decides
// again.
func (m *Middleware) reserved(ctx context.Context, job *rivertype.JobRow) (bool, error) {
	var meta struct {
		R *reservation `json:"pglimitriver_reservation"`
	}
	if json.Unmarshal(job.Metadata, &meta) != nil || meta.R == nil {
		return false, nil // metadata River wrote, without a reservation
	}
	if err := river.MetadataSet(ctx, metadataKey, nil); err != nil {
		return false, err
	}
	if meta.R.Attempt != job.Attempt {
		return false, nil // an earlier attempt's, which ran on it or was cancelled
	}
	if wait := time.Until(meta.R.Due); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return false, context.Cause(ctx)
		}
	}
	return true, nil
}

// hold takes a slot of key and keeps it, extending its lease every third
// of the TTL, until release is called. With every slot held, release is
// nil and wait says when one may be free.
func (m *Middleware) hold(ctx context.Context, key string) (release func(), wait time.Duration, err error) {
	sem := m.cfg.Semaphore
	slot, err := sem.Acquire(ctx, key)
	if err != nil || !slot.Acquired {
		return nil, slot.RetryAfter, err
	}
	// A slot lost to a cut connection returns when its lease ends.
	return sem.Hold(ctx, slot, nil), 0, nil
}
