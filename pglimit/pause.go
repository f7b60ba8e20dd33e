package pglimit

import (
	"context"
	"fmt"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
)

// Pause makes lim refuse key for d from now, on every instance, and then
// admit it again at its limit's rate.
//
// d runs on the database's clock. When it ends the key has one unit, the
// burst refilling from there. Pause is for an upstream that said to wait,
// such as a 429's Retry-After (pglimithttp's Transport). A pause never
// shortens one in force, nor a wait the key has already earned.
//
// lim must come from [New] with one GCRA limit, no per-key limits, on the
// Upsert or NoWait strategy, not on a Citus distributed table
// ([ErrUnsupported]); d must be positive and at most 366 days
// ([ErrInvalidCost]). Units that this process's lease of a busy key
// holds are dropped; those another instance leased (a limit of 1,000 a
// second or more) are not recalled.
//
// A pause whose outcome is unknown (its connection lost, or its backend
// terminated, after it was sent) is not run again; its error says so, and
// wraps [ErrUnavailable] (or [ErrTimeout], when Timeout cut the statement
// off). It may have paused the key: calling Pause
// again is safe, since a pause only moves the key's end later, to d
// from the later call, and never adds one pause to another.
func Pause(ctx context.Context, lim Limiter, key string, d time.Duration) error {
	l, err := made(lim, "Pause")
	if err != nil {
		return err
	}
	var invalid error
	if d <= 0 || d > maxPeriod {
		invalid = fmt.Errorf("%w: Pause: d = %s, not in (0, %s]", ErrInvalidCost, d, maxPeriod)
	}
	return l.act(ctx, action{op: OpPause, key: key, invalid: invalid, validKey: true, table: true}, func(ctx context.Context) error {
		return l.pause(ctx, key, d)
	})
}

// pause is Pause past the door.
func (l *limiter) pause(ctx context.Context, key string, d time.Duration) error {
	// The first unit fits when TAT + T - now <= Burst*T.
	reach := d.Microseconds() + l.burstT - l.emission
	_, err := l.db.Exec(ctx, l.keySQL.Pause, l.cfg.Namespace, key, reach)
	switch {
	case err != nil && pgtx.UnknownOutcome(err):
		// It may have paused the key: pausing it again is safe, as a
		// pause only ever moves the key's end later.
		return failed(fmt.Errorf("pause, whose outcome is unknown: %w", err))
	case err != nil:
		return failed(fmt.Errorf("pause: %w", err))
	}
	l.batch.Forget(key)
	l.flights.Forget(key)
	return nil
}
