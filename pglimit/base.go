package pglimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/lockid"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
)

// base holds what every strategy shares.
type base struct {
	db       DB
	cfg      Config
	policy   *Policy   // shared by every Decision, through Decision.Violated
	preblock *preblock // nil when off
	fallback *fallback // nil when off
	flights  *flights  // a single GCRA limit's, where the batcher does not serve it

	// worst is the longest any limit can make a key wait: the RetryAfter
	// of a refusal whose wait the statement could not read.
	worst time.Duration

	// minCapacity is the largest n AllowN accepts: what the tightest limit
	// admits at once.
	minCapacity int

	// args holds the statement parameters that never change, boxed once
	// instead of at every decision.
	args struct{ namespace, lockClass any }
}

func newBase(db DB, c Config, table string) base {
	b := base{db: db, cfg: c, policy: &Policy{Namespace: c.Namespace, Strategy: c.Strategy, Limits: c.Limits}}
	b.minCapacity = c.Limits[0].capacity()
	for _, l := range c.Limits {
		b.minCapacity = min(b.minCapacity, l.capacity())
		b.worst = max(b.worst, l.longestWait())
	}
	b.args.namespace, b.args.lockClass = c.Namespace, lockid.KeyClass(table, c.Namespace)
	if c.PreBlockSize > 0 {
		b.preblock = newPreblock(c.PreBlockSize)
		if c.Invalidator != nil {
			b.preblock.inv = c.Invalidator
			register(c.Invalidator, lockid.KeyClass(table, c.Namespace), b.preblock)
		}
	}
	if len(c.Limits) == 1 && c.Limits[0].Algorithm == GCRA && !c.Overrides {
		b.flights = newFlights()
	}
	return b
}

// Policy returns what the limiter enforces.
func (b *base) Policy() Policy {
	p := *b.policy
	p.Limits = append([]Limit(nil), p.Limits...)
	return p
}

// checkCost validates n for AllowN: positive, and no more than every limit
// admits at once.
func (b *base) checkCost(n int) error {
	if n <= 0 {
		return fmt.Errorf("%w: n must be positive, got %d", ErrInvalidCost, n)
	}
	if n > b.minCapacity {
		return fmt.Errorf("%w: n = %d is more than the limits admit at once (%d)", ErrInvalidCost, n, b.minCapacity)
	}
	return nil
}

// decide validates key, answers from the pre-block when it can (unless
// usePreblock is false), bounds ctx by the limiter's timeout and runs fn.
// Only decisions made outside a caller's transaction (inTx false) feed the
// pre-block: a caller's transaction may still roll back what it saw.
func (b *base) decide(ctx context.Context, key string, n int, inTx, usePreblock bool, fn func(ctx context.Context) (Decision, error)) (Decision, error) {
	d, err := b.enforce(ctx, key, inTx, usePreblock, fn)
	if err == nil && !d.Allowed && b.cfg.Shadow {
		return d.shadowed(n), nil
	}
	return d, err
}

// enforce is decide without shadow mode.
func (b *base) enforce(ctx context.Context, key string, inTx, usePreblock bool, fn func(ctx context.Context) (Decision, error)) (Decision, error) {
	if err := ValidateKey(key); err != nil {
		return Decision{}, err
	}
	sent := time.Now()
	if usePreblock {
		if wait := b.preblock.remaining(key, sent); wait > 0 {
			return Decision{RetryAfter: wait, ResetAfter: wait, Limit: b.cfg.Limits[0], violated: 1, policy: b.policy}, nil
		}
	}
	gen := b.preblock.generation()
	bound := b.cfg.Timeout
	if inTx {
		// The server bounds the wait (lock_timeout) and keeps the caller's
		// connection; this deadline only catches a server gone silent.
		bound += txClientTimeoutMargin
	}
	ctx, cancel := context.WithTimeoutCause(ctx, bound, ErrTimeout)
	defer cancel()
	d, err := fn(ctx)
	if err != nil {
		return Decision{}, b.wrap(ctx, err)
	}
	if !inTx && d.next > 0 {
		// The statement ran after sent, so sent+next is no later than
		// when the database will admit the key's next unit.
		b.preblock.block(key, sent.Add(d.next), gen)
	}
	return d, nil
}

// txClientTimeoutMargin is how much longer than Timeout AllowTx waits for
// the server before giving up on the connection.
const txClientTimeoutMargin = time.Second

// wrap adds the strategy name and, when the limiter's own timeout fired,
// ErrTimeout (the pgx error then only says the context was cancelled), or
// ErrReadOnly when the server could not write.
func (b *base) wrap(ctx context.Context, err error) error {
	switch {
	case errors.Is(context.Cause(ctx), ErrTimeout) && !errors.Is(err, ErrTimeout):
		return fmt.Errorf("%w (%s, after %s): %w", ErrTimeout, b.cfg.Strategy, b.cfg.Timeout, err)
	case readOnly(err):
		return fmt.Errorf("%w (%s): %w", ErrReadOnly, b.cfg.Strategy, err)
	}
	return fmt.Errorf("pglimit: %s: %w", b.cfg.Strategy, err)
}

// readOnly reports whether err says that the server cannot write, and does
// not say so as ErrReadOnly yet: SQLSTATE 25006, or no read-write server
// for a pool that asks for one.
func readOnly(err error) bool {
	return !errors.Is(err, ErrReadOnly) && pgtx.ReadOnly(err)
}

// lostRace is the refusal of a request that lost a race it could not see
// the end of (a concurrent decision, or one that kept changing the key):
// the longest wait any limit can impose, an upper bound, which the
// pre-block does not trust.
func (b *base) lostRace() Decision {
	violated := uint16(1)<<len(b.cfg.Limits) - 1
	return Decision{RetryAfter: b.worst, ResetAfter: b.worst, Limit: b.cfg.Limits[0], violated: violated, policy: b.policy}
}

// reset deletes every row of key in the limiter's namespace.
func (b *base) reset(ctx context.Context, query, key string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, b.cfg.Timeout, ErrTimeout)
	defer cancel()
	if _, err := b.db.Exec(ctx, query, b.args.namespace, key, b.args.lockClass); err != nil {
		return b.wrap(ctx, fmt.Errorf("reset: %w", err))
	}
	b.preblock.forget(key)
	b.flights.forget(key)
	return nil
}
