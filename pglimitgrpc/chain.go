package pglimitgrpc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/pglimit/cooldown/pglimit"
)

// chain is what the interceptors of this package that one call passes
// through share: whether one of them failed the call itself (refused it,
// found no valid key, could not decide, saw the client leave). The first
// that takes units puts it in the call's context; the others find it
// there. It is never the call's status that tells a refusal, so a
// handler's own ResourceExhausted is no interceptor's.
type chain struct {
	failed atomic.Bool
}

type chainKey struct{}

// chainFrom returns the chain in ctx, if an interceptor outside put one.
func chainFrom(ctx context.Context) (*chain, bool) {
	c, ok := ctx.Value(chainKey{}).(*chain)
	return c, ok
}

// withChain returns ctx with the call's chain: the one an interceptor
// outside put there, or a new one.
func withChain(ctx context.Context) (context.Context, *chain) {
	if c, ok := chainFrom(ctx); ok {
		return ctx, c
	}
	c := &chain{}
	return context.WithValue(ctx, chainKey{}, c), c
}

// failedHere records that an interceptor failed the call of ctx itself,
// so that those outside it give back what they took.
func failedHere(ctx context.Context) {
	if c, ok := chainFrom(ctx); ok {
		c.failed.Store(true)
	}
}

// held is units an admission took: its limiter and its decision.
type held struct {
	lim pglimit.Limiter
	d   pglimit.Decision
	id  string // the decision's id, by which it is refunded; "" for none
}

// holds adds d, lim's decision, to took if it took units from the
// database: a shadow or fallback admission took none.
func holds(took []held, lim pglimit.Limiter, d pglimit.Decision) []held {
	if !d.Allowed || d.Shadow || d.Fallback || d.Granted <= 0 {
		return took
	}
	return append(took, held{lim: lim, d: d})
}

// holdsID is holds for d, a decision with the id id: a replayed one took
// nothing.
func holdsID(took []held, lim pglimit.Limiter, id string, d pglimit.Decision) []held {
	if d.Replayed || !d.Allowed || d.Shadow || d.Fallback || d.Granted <= 0 {
		return took
	}
	return append(took, held{lim: lim, d: d, id: id})
}

// giveBack refunds took, the admission of a call of method that an
// interceptor inside this one failed, all at once, so that the call's
// status waits one limiter's Timeout at most. A refund that fails keeps
// the units charged, and is logged with the failures' rate limit; one
// that a limit declines (another admission of the key since, for GCRA; a
// window that has ended) is no error (see [pglimit.Limiter.Refund]).
func (l *limiter) giveBack(ctx context.Context, method string, took []held) {
	// The client may be gone: the refund is owed all the same, within the
	// limiter's Timeout.
	ctx = context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for _, h := range took {
		wg.Go(func() {
			refund := h.lim.Refund
			if h.id != "" {
				refund = func(ctx context.Context, d pglimit.Decision, n int) (bool, error) {
					return pglimit.RefundID(ctx, h.lim, h.id, n)
				}
			}
			if _, err := refund(ctx, h.d, h.d.Granted); err != nil {
				l.failures.Record(time.Now(), "method", method,
					"err", fmt.Errorf("refund of %d units of a call refused inside: %w", h.d.Granted, err))
			}
		})
	}
	wg.Wait()
}

// chainStream is a server stream whose context carries the chain.
type chainStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *chainStream) Context() context.Context { return s.ctx }
