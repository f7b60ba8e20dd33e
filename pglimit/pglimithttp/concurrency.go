package pglimithttp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/observe"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// OutcomeBusy is the [Event.Outcome] of a request [Concurrency] refused:
// every slot of its key was held.
const OutcomeBusy Outcome = observe.Busy

// Concurrency returns a middleware that serves at most sem.Slots()
// requests of a key at once, across every instance.
//
// It holds one of sem's slots for the request's key while the handler runs.
// The slot's lease is extended every third of its TTL while the handler
// runs, and the slot is released when the handler returns.
//
// A request that finds every slot held is refused as a rate limit refuses:
// 429 with the quota-exceeded problem body, violating the policy
// "concurrency", Retry-After set to the semaphore's hint
// ([pglimitsem.Slot.RetryAfter]: the slots' typical hold, at most the
// first held lease's end), and the RateLimit headers:
//
//	RateLimit-Policy: "concurrency";q=<slots>;qu="concurrent-requests"
//	RateLimit: "concurrency";r=0;t=<Retry-After>
//
// An admitted request gets RateLimit-Policy. Inside another middleware of
// this package, a request refused here is charged nothing there (package
// doc, "Stacking middlewares"). A fail-closed refusal
// ([FailClosed]) waits the semaphore's [pglimitsem.Semaphore.HoldTime].
//
// With a FlowFunc, a request waits for a slot instead, up to FlowWait,
// as a waiter of its flow ([pglimitsem.Semaphore.WaitFlow]): while the
// key's slots are all held, flows are served in proportion to their
// weights and, within a flow, in arrival order. One that waits past
// FlowWait, or whose flow's queue is full ([pglimitsem.ErrQueueFull]), is
// refused as above; a flow FlowFunc cannot give, or a bad one, is a 400.
//
// With a LevelFunc, a request waits for a slot of its priority level of
// the semaphore's Config.Levels instead, up to FlowWait, as a waiter of
// its level ([pglimitsem.Semaphore.WaitLevel]): in arrival order within
// its level, and never behind another level's waiters. One that waits
// past FlowWait is refused as above; a level LevelFunc cannot give, or
// an unknown one, is a 400.
//
// Of cfg it uses KeyFunc, FlowFunc, FlowWait, LevelFunc, Exempt, ExemptKeys,
// OnRefused, Logger, LogInterval, OnError and OnDecision; a CostFunc is
// an error. The admitted request's [Event.Decision] is zero.
func Concurrency(sem *pglimitsem.Semaphore, cfg *Config) (func(http.Handler) http.Handler, error) {
	if sem == nil {
		return nil, fmt.Errorf("%w: semaphore is nil", ErrInvalidConfig)
	}
	if cfg != nil && cfg.CostFunc != nil {
		return nil, fmt.Errorf("%w: CostFunc: a request holds one slot", ErrInvalidConfig)
	}
	if cfg != nil && cfg.IdempotencyKey {
		return nil, fmt.Errorf("%w: IdempotencyKey: a semaphore takes no decision ids", ErrInvalidConfig)
	}
	g, err := newGate(cfg)
	if err != nil {
		return nil, err
	}
	if g.cfg.LevelFunc != nil && g.cfg.FlowFunc != nil {
		return nil, fmt.Errorf("%w: LevelFunc and FlowFunc: a request either waits by fair share or takes a slot of its level", ErrInvalidConfig)
	}
	if g.cfg.FlowWait < 0 || (g.cfg.FlowWait != 0 && g.cfg.FlowFunc == nil && g.cfg.LevelFunc == nil) {
		return nil, fmt.Errorf("%w: FlowWait: must not be negative, and needs a FlowFunc or a LevelFunc; got %s", ErrInvalidConfig, g.cfg.FlowWait)
	}
	g.cfg.FlowWait = cmp.Or(g.cfg.FlowWait, defaultFlowWait)
	c := &concurrency{gate: g, sem: sem, policy: formatConcurrencyPolicy(sem.Slots())}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c.serve(w, r, next)
		})
	}, nil
}

type concurrency struct {
	gate
	sem    *pglimitsem.Semaphore
	policy string // the RateLimit-Policy value
}

// concurrencyPolicy names the policy of a concurrency limit in the
// RateLimit fields and the problem body.
const concurrencyPolicy = "concurrency"

// formatConcurrencyPolicy is the RateLimit-Policy value of a concurrency
// limit of slots: the draft's quota unit concurrent-requests, and no
// window, which a concurrency limit has none of.
func formatConcurrencyPolicy(slots int) string {
	return quoteString(concurrencyPolicy) + ";q=" + strconv.Itoa(slots) + ";qu=" + quoteString("concurrent-requests")
}

func (c *concurrency) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, ok := c.keyOf(w, r, next)
	if !ok {
		return
	}
	slot, answered, err := c.acquire(w, r, key)
	if answered {
		return
	}
	switch {
	case err != nil && errors.Is(err, context.Canceled) && errors.Is(r.Context().Err(), context.Canceled):
		c.report(r, Event{Key: key, Outcome: OutcomeCanceled, Err: err})
		clientGone(w, r)
	case err != nil:
		c.failures.Record(time.Now(), "key", key, "on_error", c.cfg.OnError, "err", err)
		switch c.cfg.OnError {
		case FailOpen:
			c.report(r, Event{Key: key, Outcome: OutcomeFailOpen, Err: err})
			next.ServeHTTP(w, r)
		case FailClosed:
			c.report(r, Event{Key: key, Outcome: OutcomeFailClosed, Err: err})
			c.busy(w, r, c.sem.HoldTime())
		default:
			c.report(r, Event{Key: key, Outcome: OutcomeUnavailable, Err: err})
			c.serviceUnavailable(w, r, time.Second)
		}
	case !slot.Acquired:
		c.report(r, Event{Key: key, Outcome: OutcomeBusy})
		c.busy(w, r, slot.RetryAfter)
	default:
		c.report(r, Event{Key: key, Cost: 1, Outcome: OutcomeAdmitted})
		r, s := stackOf(r)
		s.admit(w.Header(), c.policy, "")
		c.hold(r, key, slot, func() { next.ServeHTTP(w, r) })
	}
}

// FlowFunc returns the flow of a request for [Config.FlowFunc]: a tenant
// and its weight.
type FlowFunc func(r *http.Request) (pglimitsem.Flow, error)

// defaultFlowWait is Config.FlowWait's default.
const defaultFlowWait = 10 * time.Second

// errWaitedEnough is the cause of a FlowWait that ended.
var errWaitedEnough = errors.New("pglimithttp: waited FlowWait for a slot")

// noFlow refuses a FlowFunc, a FlowWait or a LevelFunc outside
// Concurrency.
func noFlow(cfg *Config) error {
	if cfg != nil && (cfg.FlowFunc != nil || cfg.FlowWait != 0 || cfg.LevelFunc != nil) {
		return fmt.Errorf("%w: FlowFunc, FlowWait and LevelFunc are for Concurrency only", ErrInvalidConfig)
	}
	return nil
}

// acquire takes a slot of key for r: at once, or with a FlowFunc or a
// LevelFunc as a waiter of r's flow or level, for at most FlowWait. A
// wait that ran out, or a full queue, is a slot not acquired. answered
// is true when it answered r itself: a bad flow's or level's 400.
func (c *concurrency) acquire(w http.ResponseWriter, r *http.Request, key string) (_ pglimitsem.Slot, answered bool, _ error) {
	var (
		wait func(ctx context.Context) (pglimitsem.Slot, error)
		bad  error // an error of the request's own: a 400
		what string
	)
	switch {
	case c.cfg.LevelFunc != nil:
		what = "LevelFunc"
		level, err := c.cfg.LevelFunc(r)
		bad = err
		wait = func(ctx context.Context) (pglimitsem.Slot, error) { return c.sem.WaitLevel(ctx, key, level) }
	case c.cfg.FlowFunc != nil:
		what = "FlowFunc"
		flow, err := c.cfg.FlowFunc(r)
		bad = err
		wait = func(ctx context.Context) (pglimitsem.Slot, error) { return c.sem.WaitFlow(ctx, key, flow) }
	default:
		slot, err := c.sem.Acquire(r.Context(), key)
		return slot, false, err
	}
	if bad == nil {
		ctx, cancel := context.WithTimeoutCause(r.Context(), c.cfg.FlowWait, errWaitedEnough)
		defer cancel()
		slot, err := wait(ctx)
		switch {
		case errors.Is(err, pglimitsem.ErrInvalidFlow), errors.Is(err, pglimitsem.ErrUnknownLevel):
			bad = err // a 400, below
		case errors.Is(err, pglimitsem.ErrQueueFull):
			return slot, false, nil
		case err != nil && errors.Is(context.Cause(ctx), errWaitedEnough) && r.Context().Err() == nil:
			return pglimitsem.Slot{RetryAfter: c.sem.HoldTime()}, false, nil
		default:
			return slot, false, err
		}
	}
	c.extract(w, r, func(*http.Request) (string, error) { return key, fmt.Errorf("%s: %w", what, bad) })
	return pglimitsem.Slot{}, true, nil
}

// hold runs serve while it keeps slot (pglimitsem's Hold), and releases
// it afterwards, even if serve panics; the client may be gone, and the
// slot still goes back.
func (c *concurrency) hold(r *http.Request, key string, slot pglimitsem.Slot, serve func()) {
	release := c.sem.Hold(r.Context(), slot, func(err error) { c.failures.Record(time.Now(), "key", key, "err", err) })
	defer release()
	serve()
}

// busy writes the 429 of a key whose slots are all held, or hands r to
// OnRefused with the headers set.
func (c *concurrency) busy(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	c.refuse(w, r, c.policy, concurrencyPolicy, 0, wait, wait, []string{concurrencyPolicy}, nil)
}
