package pglimitriver

import (
	"context"
	"errors"
	"fmt"
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
// a worker's Middleware for one kind of job.
type Middleware struct {
	river.MiddlewareDefaults
	cfg Config
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
	if c.SlotSnooze == 0 {
		c.SlotSnooze = time.Second
	}
	if c.SlotSnooze < time.Millisecond || c.SlotSnooze > time.Hour {
		return nil, fmt.Errorf("%w: SlotSnooze must be from 1ms to 1h, got %s", ErrInvalidConfig, c.SlotSnooze)
	}
	return &Middleware{cfg: c}, nil
}

// Work decides job before doInner works it. A job the limits refuse, or
// whose key has every slot held, is snoozed until the limits would admit
// it or a slot may be free (river.JobSnooze): it uses up no attempt. A
// job whose key or cost is not valid is cancelled (river.JobCancel): its
// args would never make them valid. A failure of the database is the
// attempt's error, and River retries it.
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
		if cost, err = m.cfg.Cost(job); err != nil {
			return river.JobCancel(fmt.Errorf("%w: pglimitriver: the job's cost: %w", pglimit.ErrInvalidCost, err))
		}
		switch d, err = m.cfg.Limiter.AllowN(ctx, key, cost); {
		case errors.Is(err, pglimit.ErrInvalidCost):
			return river.JobCancel(err)
		case err != nil:
			return err
		case !d.Allowed:
			return river.JobSnooze(max(d.RetryAfter, time.Millisecond))
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
