package pglimitgrpc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// FlowFunc returns the flow of a call of method for [Config.Flow]: a
// tenant and its weight. An error fails the call with
// codes.InvalidArgument, and nothing is written.
type FlowFunc func(ctx context.Context, method string) (pglimitsem.Flow, error)

// UnaryServerConcurrency returns an interceptor that runs at most
// sem.Slots() unary calls of a key at once, across every instance.
//
// A call holds one of sem's slots for its key while its handler runs:
// the lease is extended every third of its TTL, and the slot is released
// when the handler returns, or panics, under the call's values but not
// its cancellation, so that a call whose client is gone gives its slot
// back, within the semaphore's Timeout, before its status is sent.
//
// A call that finds every slot held fails with codes.ResourceExhausted,
// a RetryInfo of the semaphore's hint ([pglimitsem.Slot.RetryAfter]: the
// slots' typical hold, at most the first held lease's end), the same in
// the trailer grpc-retry-pushback-ms, and a QuotaFailure naming the limit
// "concurrency".
//
// With a [Config.Flow], a call waits for a slot instead, up to
// Config.FlowWait and never past its deadline, as a waiter of its flow
// ([pglimitsem.Semaphore.WaitFlow]): while the key's slots are all held,
// flows are served in proportion to their weights and, within a flow, in
// arrival order. One that waits FlowWait, or whose flow's queue is full
// ([pglimitsem.ErrQueueFull]), is refused as above, retry after the
// semaphore's [pglimitsem.Semaphore.HoldTime]; one whose deadline passes
// fails with codes.DeadlineExceeded.
//
// With a [Config.Level], a call waits for a slot of its priority level,
// up to Config.FlowWait and never past its deadline
// ([pglimitsem.Semaphore.WaitLevel]): in arrival order within its level,
// never behind another level's waiters. One that waits FlowWait is
// refused as above.
//
// A flow or level the function cannot give, a bad flow or an unknown
// level fails the call with codes.InvalidArgument, as a bad key does, and
// writes nothing. A semaphore that fails follows Config.OnError:
// codes.Unavailable with a RetryInfo of one second; the handler run
// without a slot (FailOpen); or the refusal above with the hold time and
// an ErrorInfo of reason "RATE_LIMITER_UNAVAILABLE" (FailClosed).
//
// Of cfg it uses Key, Exempt, OnError, Logger, LogInterval, OnDecision,
// Flow, FlowWait and Level; Methods and IDMetadata are an error. The
// admitted call's [Event.Decision] is zero. Chained inside interceptors
// of this package, a call it fails itself is charged nothing by them
// (package doc, "Chaining interceptors").
func UnaryServerConcurrency(sem *pglimitsem.Semaphore, cfg *Config) (grpc.UnaryServerInterceptor, error) {
	c, err := newConcurrency(sem, cfg)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		release, err := c.take(ctx, info.FullMethod, func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) })
		if err != nil {
			failedHere(ctx)
			return nil, err
		}
		defer release()
		return handler(ctx, req)
	}, nil
}

// StreamServerConcurrency holds a slot for each stream, from its opening
// until its handler returns, as [UnaryServerConcurrency] does for unary
// calls.
func StreamServerConcurrency(sem *pglimitsem.Semaphore, cfg *Config) (grpc.StreamServerInterceptor, error) {
	c, err := newConcurrency(sem, cfg)
	if err != nil {
		return nil, err
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		release, err := c.take(ss.Context(), info.FullMethod, ss.SetTrailer)
		if err != nil {
			failedHere(ss.Context())
			return err
		}
		defer release()
		return handler(srv, ss)
	}, nil
}

// concurrency is the state of the concurrency interceptors: the
// limiter's key, exemptions, failure policy and report, over a semaphore.
type concurrency struct {
	*limiter
	sem      *pglimitsem.Semaphore
	flow     FlowFunc
	flowWait time.Duration
	level    func(ctx context.Context, method string) (string, error)
}

// defaultFlowWait is Config.FlowWait's default.
const defaultFlowWait = 10 * time.Second

// errWaitedEnough is the cause of a FlowWait that ended.
var errWaitedEnough = errors.New("pglimitgrpc: waited FlowWait for a slot")

func newConcurrency(sem *pglimitsem.Semaphore, cfg *Config) (*concurrency, error) {
	c := cmp.Or(cfg, &Config{})
	switch {
	case sem == nil:
		return nil, fmt.Errorf("%w: semaphore is nil", ErrInvalidConfig)
	case len(c.Methods) > 0:
		return nil, fmt.Errorf("%w: Methods: a call of any method holds a slot of the one semaphore", ErrInvalidConfig)
	case c.IDMetadata != "":
		return nil, fmt.Errorf("%w: IDMetadata: a semaphore takes no decision ids", ErrInvalidConfig)
	case c.Flow != nil && c.Level != nil:
		return nil, fmt.Errorf("%w: Flow and Level: a call either waits by fair share or takes a slot of its level", ErrInvalidConfig)
	case c.FlowWait < 0 || (c.FlowWait != 0 && c.Flow == nil && c.Level == nil):
		return nil, fmt.Errorf("%w: FlowWait: must not be negative, and needs a Flow or a Level; got %s", ErrInvalidConfig, c.FlowWait)
	}
	l, err := newBase(c)
	if err != nil {
		return nil, err
	}
	return &concurrency{limiter: l, sem: sem, flow: c.Flow, flowWait: cmp.Or(c.FlowWait, defaultFlowWait), level: c.Level}, nil
}

// noFlow refuses Flow, FlowWait and Level outside the concurrency
// interceptors.
func noFlow(cfg *Config) error {
	if cfg != nil && (cfg.Flow != nil || cfg.FlowWait != 0 || cfg.Level != nil) {
		return fmt.Errorf("%w: Flow, FlowWait and Level are for the concurrency interceptors only", ErrInvalidConfig)
	}
	return nil
}

// take takes a slot for a call of method, and returns what releases it,
// or the status that fails the call; trailer sets the call's trailer.
func (c *concurrency) take(ctx context.Context, method string, trailer func(metadata.MD)) (release func(), _ error) {
	if c.exempt[method] {
		c.report(ctx, Event{Method: method, Outcome: OutcomeExempt})
		return func() {}, nil
	}
	key, err := c.key(ctx, method)
	if err == nil {
		err = pglimit.ValidateKey(key)
	}
	if err != nil {
		c.report(ctx, Event{Method: method, Outcome: OutcomeBadKey, Err: err})
		return nil, status.Errorf(codes.InvalidArgument, "pglimitgrpc: the call's concurrency key: %v", err)
	}
	slot, invalid, err := c.acquire(ctx, method, key)
	ev := Event{Method: method, Key: key, Err: err}
	switch {
	case invalid != nil:
		ev.Outcome, ev.Err = OutcomeBadKey, invalid
		c.report(ctx, ev)
		return nil, status.Errorf(codes.InvalidArgument, "pglimitgrpc: the call's %v", invalid)
	case err != nil && ctx.Err() != nil:
		ev.Outcome = OutcomeCanceled
		c.report(ctx, ev)
		return nil, status.FromContextError(ctx.Err()).Err()
	case err != nil:
		c.failures.Record(time.Now(), "method", method, "key", key, "err", err)
		ev.Outcome = failOutcome(c.onError)
		c.report(ctx, ev)
		switch c.onError {
		case FailOpen:
			return func() {}, nil
		case FailClosed:
			return nil, c.busy(c.sem.HoldTime(), trailer, &errdetails.ErrorInfo{Reason: "RATE_LIMITER_UNAVAILABLE", Domain: "pglimit"})
		}
		return nil, unavailable(time.Second)
	case !slot.Acquired:
		ev.Outcome = OutcomeBusy
		c.report(ctx, ev)
		return nil, c.busy(slot.RetryAfter, trailer, nil)
	}
	ev.Outcome = OutcomeAdmitted
	c.report(ctx, ev)
	return c.sem.Hold(ctx, slot, func(err error) { c.failures.Record(time.Now(), "method", method, "key", key, "err", err) }), nil
}

// acquire takes a slot of key for a call of method: at once; or for at
// most FlowWait, with a Level as a waiter of the call's level, with a
// Flow as a waiter of its flow. A wait that ran out, or a full queue, is a
// slot not acquired. invalid is the call's flow or level that could not
// be had, or is bad; nothing was written then.
func (c *concurrency) acquire(ctx context.Context, method, key string) (_ pglimitsem.Slot, invalid, _ error) {
	var wait func(ctx context.Context) (pglimitsem.Slot, error)
	switch {
	case c.level != nil:
		level, err := c.level(ctx, method)
		if err != nil {
			return pglimitsem.Slot{}, fmt.Errorf("priority level: %w", err), nil
		}
		wait = func(ctx context.Context) (pglimitsem.Slot, error) { return c.sem.WaitLevel(ctx, key, level) }
	case c.flow != nil:
		flow, err := c.flow(ctx, method)
		if err != nil {
			return pglimitsem.Slot{}, fmt.Errorf("flow: %w", err), nil
		}
		wait = func(ctx context.Context) (pglimitsem.Slot, error) { return c.sem.WaitFlow(ctx, key, flow) }
	default:
		slot, err := c.sem.Acquire(ctx, key)
		return slot, nil, err
	}
	wctx, cancel := context.WithTimeoutCause(ctx, c.flowWait, errWaitedEnough)
	defer cancel()
	slot, err := wait(wctx)
	switch {
	case errors.Is(err, pglimitsem.ErrUnknownLevel):
		return slot, fmt.Errorf("priority level: %w", err), nil
	case errors.Is(err, pglimitsem.ErrInvalidFlow):
		return slot, fmt.Errorf("flow: %w", err), nil
	case errors.Is(err, pglimitsem.ErrQueueFull):
		return slot, nil, nil
	case err != nil && errors.Is(context.Cause(wctx), errWaitedEnough) && ctx.Err() == nil:
		return pglimitsem.Slot{RetryAfter: c.sem.HoldTime()}, nil, nil
	}
	return slot, nil, err
}

// busy is codes.ResourceExhausted for a key whose slots are all held,
// retry after wait, with extra details if not nil.
func (c *concurrency) busy(wait time.Duration, trailer func(metadata.MD), extra *errdetails.ErrorInfo) error {
	qf := &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject:     "limit:concurrency",
		Description: fmt.Sprintf("%d calls in flight", c.sem.Slots()),
	}}}
	return exhausted([]string{"concurrency"}, qf, wait, trailer, extra)
}
