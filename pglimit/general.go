package pglimit

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
)

// The general statement (general.allow, in internal/queries, which
// internal/engine writes) decides for any set of limits on the Upsert and
// NoWait tables; general.peek is Peek's.

// Modes of the general statement.
const (
	modeAllow   = 0 // admit n or refuse
	modeAtMost  = 1 // admit up to n
	modeReserve = 2 // admit n within a maximum delay (GCRA only)
	modes       = 3
)

// scanGeneral reads a general statement's answer: whether it admitted, the
// row's state and expires_at (µs) it decided on, and the time; the rest of
// the Decision is computed from them. For Peek, which decides here, the
// first column is NULL. The extra column goes to setting (nil: not read).
func (l *limiter) scanGeneral(row pgx.Row, n, mode int, maxDelay int64, setting any) (d Decision, decided bool, err error) {
	var r struct {
		admitted      *bool
		state         []int64
		tat           *int64
		now           int64
		rates, bursts []int64
		unknown       []string
	}
	dest := []any{&r.admitted, &r.state, &r.tat, &r.now, setting}
	if l.cfg.Overrides {
		dest = append(dest, &r.rates, &r.bursts, &r.unknown)
	}
	if err = row.Scan(dest...); err != nil {
		return Decision{}, false, noRowsAsUndecided(unknownZone(l.cfg.Limits, err))
	}
	limits, sp, policy := l.cfg.Limits, l.specs, l.policy
	if l.cfg.Overrides {
		if limits, policy, err = l.ownLimits(r.rates, r.bursts, r.unknown, n, mode, maxDelay); err != nil {
			return Decision{}, false, err
		}
		sp = specs(limits)
	}
	e := arith.Evaluate(sp, r.state, r.tat, r.now, int64(n), arith.Mode(mode), maxDelay)
	if r.admitted != nil && *r.admitted != e.Allowed {
		return Decision{}, false, fmt.Errorf("the database's decision (admitted %t) differs from the library's on the same state: a bug; please report it", *r.admitted)
	}
	d = evaluated(e, limits, policy, r.now, n, mode)
	if r.admitted != nil { // a decision, not a Peek: the caller sets the key
		d = l.withTicket(d, "", limits, e.Anchors)
	}
	return d, true, nil
}

// evaluated is the Decision of e, a request of n units in mode on limits
// (policy's) at now (µs).
func evaluated(e arith.Evaluation, limits []Limit, policy *Policy, now int64, n, mode int) Decision {
	d := Decision{
		Allowed:    e.Allowed,
		Granted:    int(e.Granted),
		Remaining:  int(e.Remaining),
		RetryAfter: micros(e.Retry),
		ResetAfter: micros(e.Reset),
		Delay:      micros(e.Delay),
		Limit:      limits[e.Binding],
		violated:   e.Violated,
		policy:     policy,
		at:         now,
	}
	if !e.Allowed && (n == 1 || mode == modeAtMost) && mode != modeReserve {
		d.next = d.RetryAfter // the wait for one unit
	}
	return d
}

// ownLimits is a key's own limits and their Policy, from the rates, bursts
// and unknown names a statement read for it (Config.Overrides), and
// whether n units fit them in mode: the limiter checked n against no
// limits.
func (l *limiter) ownLimits(rates, bursts []int64, unknown []string, n, mode int, maxDelay int64) ([]Limit, *Policy, error) {
	limits, err := keyLimits(l.cfg.Limits, rates, bursts, unknown)
	if err != nil {
		return nil, nil, err
	}
	if err = costFits(limits, n, mode, maxDelay); err != nil {
		return nil, nil, err
	}
	return limits, &Policy{Namespace: l.policy.Namespace, Strategy: l.policy.Strategy, Limits: limits}, nil
}
