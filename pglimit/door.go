package pglimit

import (
	"context"
	"fmt"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/engine"
)

// action is one operation on a key that decides nothing, as act takes it:
// what the Observer sees of it and what act checks before it runs.
type action struct {
	op  Op     // observed as, and looked up in the capability table as
	key string // observed; validated when validKey
	id  string // observed: RefundID's and SettleID's
	n   int    // observed

	// invalid is the operation's own check of its arguments, nil when
	// they pass.
	invalid error
	// validKey: key must be valid (ValidateKey).
	validKey bool
	// decided: the operation acts on a decision the limiter made
	// (Refund, Settle), after its table check, so the capability is read
	// on what the check found; leased: the decision's units came from a
	// lease. Otherwise it is read before any statement, on a table not
	// checked yet.
	decided, leased bool
	// table: the operation checks the limiter's table (check) under the
	// deadline, and then reads the capability again on what the check
	// found; what names the operation in the check's error ("" for
	// none).
	table bool
	what  string
}

// act is the one way every operation on a key that decides nothing takes
// (Reset, Refund, RefundID, Settle, SettleID, Pause, Inspect, LimitedKeys,
// SetKeyLimits, SetKeyLimitsFor, ListKeyLimits); the decision methods
// take decide. In this order:
//
//  1. the Observer sees it start;
//  2. the capability table (engine.Check) is read for a.op;
//  3. a.invalid, then the key (a.validKey), is checked;
//  4. ctx is bounded by Config.Timeout, whose end is ErrTimeout;
//  5. the table is checked (a.table), and the capability read again on
//     what the check found;
//  6. fn runs, and an error it marks as a statement's (failed) is wrapped
//     as the limiter's calls' are (wrap), under that bound;
//  7. the Observer sees it end.
//
// The capability comes before the arguments, as each of these operations
// read it before the door and as Reserve's checkReserve does: one the
// limiter cannot do is ErrUnsupported whatever its arguments
// (TestDoorUnsupportedBeforeArguments). Bad input fails before the
// deadline starts and before any statement. fn's other errors are
// returned as they are: the sentinels of a misuse it finds under its own
// locks (a settled decision), and those of Inspect, LimitedKeys and the
// key limits' operations, which statementErr names by operation and
// diagnoses against the table.
//
// AllowAll does not pass it: one statement decides for several limiters,
// and each level is observed on its own limiter's Observer, with that
// level's decision. It bounds its deadline as act does (withDeadline).
func (l *limiter) act(ctx context.Context, a action, fn func(ctx context.Context) error) error {
	_, err := l.observe(ctx, a.op, a.key, a.id, a.n, func(ctx context.Context) (Decision, error) {
		return Decision{}, l.acted(ctx, a, fn)
	})
	return err
}

// acted is act unobserved.
func (l *limiter) acted(ctx context.Context, a action, fn func(ctx context.Context) error) error {
	dep := engine.Unchecked
	if a.decided {
		dep = l.deployment()
	}
	if err := l.capable(a, dep); err != nil {
		return err
	}
	if a.invalid != nil {
		return a.invalid
	}
	if a.validKey {
		if err := ValidateKey(a.key); err != nil {
			return err
		}
	}
	ctx, cancel := withDeadline(ctx, l.cfg.Timeout, false)
	defer cancel()
	if a.table {
		if err := l.check(ctx, l.db); err != nil {
			if a.what != "" {
				err = fmt.Errorf("%s: %w", a.what, err)
			}
			return l.wrap(ctx, err)
		}
		if err := l.capable(a, l.deployment()); err != nil {
			return err
		}
	}
	err := fn(ctx)
	if f, ok := err.(failure); ok {
		return l.wrap(ctx, f.err)
	}
	return err
}

// capable reads the capability table for a on a table the database made
// dep.
func (l *limiter) capable(a action, dep engine.Deployment) error {
	s := l.shape(dep)
	s.Leased = a.leased
	return engine.Check(engine.Op(a.op), s)
}

// failure is an error of a statement that act's fn ran, which act wraps.
type failure struct{ err error }

func (f failure) Error() string { return f.err.Error() }
func (f failure) Unwrap() error { return f.err }

// failed marks err, a statement's, for act to wrap.
func failed(err error) error { return failure{err} }

// withDeadline bounds ctx by timeout, whose end is ErrTimeout. In a
// caller's transaction (inTx) the server bounds the wait (lock_timeout)
// and keeps the caller's connection; the deadline, txClientTimeoutMargin
// later, only catches a server gone silent.
func withDeadline(ctx context.Context, timeout time.Duration, inTx bool) (context.Context, context.CancelFunc) {
	if inTx {
		timeout += txClientTimeoutMargin
	}
	return context.WithTimeoutCause(ctx, timeout, ErrTimeout)
}
