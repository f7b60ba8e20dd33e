package pglimit

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// giveBackTimeout bounds the Refund with which a waiter that gives up
// returns its reserved units: WaitN returns at most this long after its
// context ends.
const giveBackTimeout = 250 * time.Millisecond

// Wait is WaitN with n = 1.
func Wait(ctx context.Context, lim Limiter, key string) (Decision, error) {
	return WaitN(ctx, lim, key, 1)
}

// WaitN blocks until n units of key are the caller's, or ctx ends.
//
// It reserves them ([Limiter.Reserve]) within the time ctx leaves, then
// waits out the reservation's Delay. Like x/time/rate's WaitN, for
// background work and outbound calls that would rather wait their turn than
// fail.
//
// Across instances the database hands out the slots, so waiters of every
// instance are served in the order they reserved, at the limits' rate. A
// wait longer than ctx allows consumes nothing and returns the refusal
// with an error wrapping [context.DeadlineExceeded]. A caller whose ctx
// ends during the wait gives its units back with [Limiter.Refund], which
// succeeds while no later reservation has been made on the key (as
// x/time/rate's Reservation.Cancel, as much as the reservations after it
// allow); else the units stay spent, which never over-admits. A waiter
// with a decision id ([WithID]) keeps them instead: its retry with the id
// replays the reservation and waits only what is left of it. WaitN then
// returns ctx's cause ([context.Cause]) at most 250 ms after ctx ends, as
// it does when ctx ends while the reservation's statement runs.
//
// n must not exceed any limit's Burst ([ErrInvalidCost]); the limits must
// be GCRA, as Reserve's ([ErrUnsupported]). Without a deadline on ctx a
// wait may last up to 366 days.
func WaitN(ctx context.Context, lim Limiter, key string, n int) (Decision, error) {
	d, err := WaitAtMost(ctx, lim, key, n, maxPeriod)
	if err == nil && !d.Allowed {
		err = fmt.Errorf("pglimit: WaitN: %d units of %q come after the context's deadline: %w", n, key, context.DeadlineExceeded)
	}
	return d, err
}

// WaitAtMost is WaitN for a wait of at most maxDelay (and within ctx's
// deadline).
//
// Units that would come later are refused at once, with the refusal and
// no error, and nothing is consumed. As [Limiter.Reserve]'s, the refusal's
// RetryAfter is when the same call is admitted: the units' wait less
// maxDelay (or less the time ctx left, if that was shorter). An
// admission's Delay is how long it waited. nginx's limit_req without
// nodelay holds requests this way (pglimithttp's Config.MaxDelay).
func WaitAtMost(ctx context.Context, lim Limiter, key string, n int, maxDelay time.Duration) (Decision, error) {
	if maxDelay < 0 || maxDelay > maxPeriod {
		return Decision{}, fmt.Errorf("%w: WaitAtMost: maxDelay %s, not in [0, %s]", ErrInvalidCost, maxDelay, maxPeriod)
	}
	for _, l := range lim.Policy().Limits {
		if l.Algorithm == GCRA && n > l.Burst {
			return Decision{}, fmt.Errorf("%w: Wait: n = %d is more than limit %q's burst (%d)", ErrInvalidCost, n, l.Name, l.Burst)
		}
	}
	if deadline, ok := ctx.Deadline(); ok {
		left := time.Until(deadline)
		if left <= 0 {
			return Decision{}, context.Cause(ctx)
		}
		maxDelay = min(maxDelay, left)
	}
	d, err := lim.Reserve(ctx, key, n, maxDelay)
	if err != nil && ctx.Err() != nil {
		// ctx ended while the reservation's statement ran: the driver's
		// error says only ctx.Err(); the caller's cause is what it set.
		if cause := context.Cause(ctx); !errors.Is(err, cause) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
	}
	if err != nil || !d.Allowed || d.Delay <= 0 {
		return d, err
	}
	t := time.NewTimer(d.Delay)
	defer t.Stop()
	select {
	case <-t.C:
		return d, nil
	case <-ctx.Done():
		if _, ok := IDFrom(ctx); !ok {
			giveBack, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
			defer cancel()
			_, _ = lim.Refund(giveBack, d, n) // false or an error: the units stay spent
		}
		return Decision{}, context.Cause(ctx)
	}
}
