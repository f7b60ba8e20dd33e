package pglimit

import (
	"context"
	"fmt"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/fault"
	"github.com/pglimit/cooldown/pglimit/internal/flights"
	"github.com/pglimit/cooldown/pglimit/internal/lockid"
	"github.com/pglimit/cooldown/pglimit/internal/preblock"
)

// newLimiter returns a limiter of c over db on table, with what every
// strategy shares set; the strategy's constructor adds its statements.
func newLimiter(db DB, c Config, table string) *limiter {
	l := &limiter{db: db, cfg: c, policy: &Policy{Namespace: c.Namespace, Strategy: c.Strategy, Limits: c.Limits}, specs: specs(c.Limits)}
	l.observers = newObservers(c.Observer)
	l.caps = capsOf(c, table)
	l.minCapacity = c.Limits[0].capacity()
	for _, lim := range c.Limits {
		l.minCapacity = min(l.minCapacity, lim.capacity())
		l.worst = max(l.worst, lim.longestWait())
	}
	l.lockClass = lockid.KeyClass(table, c.Namespace)
	l.args.namespace, l.args.lockClass = c.Namespace, l.lockClass
	l.args.idRetention = c.IDRetention.Microseconds()
	if c.PreBlockSize > 0 {
		var trusted func(time.Time) bool
		if c.Invalidator != nil {
			trusted = c.Invalidator.trusted
		}
		l.preblock = preblock.New(c.PreBlockSize, trusted)
		if c.Invalidator != nil {
			register(c.Invalidator, l.lockClass, l.preblock)
		}
	}
	if len(c.Limits) == 1 && c.Limits[0].Algorithm == GCRA && !c.Overrides {
		l.flights = flights.New[Decision]()
	}
	return l
}

// Policy returns what the limiter enforces.
func (l *limiter) Policy() Policy {
	p := *l.policy
	p.Limits = append([]Limit(nil), p.Limits...)
	return p
}

// checkCost validates n for AllowN: positive, and no more than every limit
// admits at once.
func (l *limiter) checkCost(n int) error {
	if n <= 0 {
		return fmt.Errorf("%w: n must be positive, got %d", ErrInvalidCost, n)
	}
	if n > l.minCapacity {
		return fmt.Errorf("%w: n = %d is more than the limits admit at once (%d)", ErrInvalidCost, n, l.minCapacity)
	}
	return nil
}

// path is how a call reaches its decision.
type path struct {
	// inTx: in a caller's transaction, whose server bounds the wait
	// (lock_timeout), and which may still roll back what it saw, so its
	// decisions do not feed the pre-block.
	inTx bool
	// preblock: the pre-block may answer a refusal without a round trip.
	preblock bool
	// fallback: the limiter's fallback decides in process while the
	// database is unavailable (Config.Fallback).
	fallback bool
}

var (
	// allowing is Allow's and AllowN's: in their own transaction, the
	// pre-block may answer, and the fallback may decide.
	allowing = path{preblock: true, fallback: true}
	// preblocked is a call in its own transaction that the pre-block may
	// answer: AllowAtMost, Peek.
	preblocked = path{preblock: true}
	// direct is a call in its own transaction that always asks the
	// database: Reserve, whose delay the pre-block cannot tell.
	direct = path{}
	// callersTx is a call in the caller's transaction: AllowTx.
	callersTx = path{inTx: true}
)

// request is one call of a decision method: the method, as
// Observation.Op names it, the key, the units, and the path it takes.
type request struct {
	op  Op
	key string
	n   int
	via path
}

// decide is every decision method's way to its decision: the Observer
// sees it, invalid (the method's own check of its arguments) and the key
// are validated, and fn decides it on the database, unless the fallback
// or the pre-block answers first. Shadow mode then lets a refusal
// through.
func (l *limiter) decide(ctx context.Context, r request, invalid error, fn func(ctx context.Context) (Decision, error)) (Decision, error) {
	if l.observers.decisions == nil {
		return l.decideValid(ctx, r, invalid, fn)
	}
	id, _ := IDFrom(ctx)
	return l.observe(ctx, r.op, r.key, id, r.n, func(ctx context.Context) (Decision, error) {
		return l.decideValid(ctx, r, invalid, fn)
	})
}

// decideValid is decide unobserved.
func (l *limiter) decideValid(ctx context.Context, r request, invalid error, fn func(ctx context.Context) (Decision, error)) (Decision, error) {
	if invalid != nil {
		return Decision{}, invalid
	}
	if err := ValidateKey(r.key); err != nil {
		return Decision{}, err
	}
	defer l.record(ctx) // after the decision, which it must not slow down
	if hasID, err := l.checkID(ctx, r.op); err != nil {
		return Decision{}, err
	} else if hasID {
		// A decision with an id asks the database: neither the pre-block
		// nor the fallback knows the id.
		r.via.preblock, r.via.fallback = false, false
	}
	if r.via.fallback && l.fallback != nil {
		return l.withFallback(ctx, r.key, r.n, func() (Decision, error) { return l.enforce(ctx, r, fn) })
	}
	return l.enforce(ctx, r, fn)
}

// enforce answers from the pre-block when the path lets it, bounds ctx by
// the limiter's timeout and runs fn, then applies shadow mode. Only
// decisions made in their own transaction feed the pre-block.
func (l *limiter) enforce(ctx context.Context, r request, fn func(ctx context.Context) (Decision, error)) (Decision, error) {
	d, err := l.database(ctx, r.key, r.via, fn)
	if err == nil && !d.Allowed && l.cfg.Shadow {
		return d.shadowed(r.n), nil
	}
	return d, err
}

// database is enforce without shadow mode.
func (l *limiter) database(ctx context.Context, key string, via path, fn func(ctx context.Context) (Decision, error)) (Decision, error) {
	sent := time.Now()
	if via.preblock {
		if wait := l.preblock.Remaining(key, sent); wait > 0 {
			return Decision{RetryAfter: wait, ResetAfter: wait, Limit: l.cfg.Limits[0], violated: 1, policy: l.policy}, nil
		}
	}
	gen := l.preblock.Generation()
	ctx, cancel := withDeadline(ctx, l.cfg.Timeout, via.inTx)
	defer cancel()
	d, err := fn(ctx)
	if err != nil {
		return Decision{}, l.wrap(ctx, err)
	}
	if !via.inTx && d.next > 0 {
		// The statement ran after sent, so sent+next is no later than
		// when the database will admit the key's next unit.
		l.preblock.Block(key, sent.Add(d.next), gen)
	}
	return d, nil
}

// txClientTimeoutMargin is how much longer than Timeout AllowTx waits for
// the server before giving up on the connection.
const txClientTimeoutMargin = time.Second

// wrap is fault.Wrap for the limiter's calls, named by its strategy.
func (l *limiter) wrap(ctx context.Context, err error) error {
	return fault.Wrap(ctx, string(l.cfg.Strategy), l.cfg.Timeout, err)
}

// lostRace is the refusal of a request that lost a race it could not see
// the end of (a concurrent decision, or one that kept changing the key):
// the longest wait any limit can impose, an upper bound, which the
// pre-block does not trust.
func (l *limiter) lostRace() Decision {
	violated := uint16(1)<<len(l.cfg.Limits) - 1
	return Decision{RetryAfter: l.worst, ResetAfter: l.worst, Limit: l.cfg.Limits[0], violated: violated, policy: l.policy}
}
