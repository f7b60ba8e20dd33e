package pglimit

import (
	"context"
	"fmt"
	"strings"
	"sync"
)

// refundTicket is what an admission leaves for a refund: which key, how
// many units, and where it left each limit (evaluation.anchors), with the
// limits it was decided with. Copies of a Decision share it, so that its
// units are given back at most once.
type refundTicket struct {
	owner  *base
	key    string
	limits []Limit

	mu       sync.Mutex
	granted  int
	refunded int
	anchors  []int64
}

// refundSingleSQL gives back $4 µs of a single GCRA limit's TAT, if the
// TAT is still $3, the one the admission left: then nothing was admitted
// after it, or everything admitted after it was given back, and the key
// is exactly as if the refunded units had never been asked for.
const refundSingleSQL = `
UPDATE %[1]s SET expires_at = expires_at - $4 * interval '1 microsecond'
WHERE namespace = $1 AND key = $2 AND expires_at = timestamptz 'epoch' + $3 * interval '1 microsecond'
RETURNING ARRAY[true]`

// refundGeneralSQL gives back $4 units of each limit the admission still
// weighs on, by the anchors $3 (one per limit) and, for GCRA, the
// emission intervals $5: a GCRA limit whose TAT is still its anchor, a
// fixed window still the one it counted in, a sliding window's current
// or previous window. It returns which limits took the units back. %[2]s
// is the new state, %[3]s the flags, both written by refundState, %[4]d
// the state's length and %[5]d the number of limits.
const refundGeneralSQL = `
WITH old AS (
    SELECT t.state FROM %[1]s AS t
    WHERE t.namespace = $1 AND t.key = $2 AND cardinality(t.state) = %[4]d
      AND cardinality($5::bigint[]) = %[5]d
    FOR UPDATE
), changed AS (
    UPDATE %[1]s AS t SET state = %[2]s FROM old
    WHERE t.namespace = $1 AND t.key = $2
    RETURNING 1
)
SELECT %[3]s FROM old WHERE EXISTS (SELECT FROM changed)`

// refundState writes refundGeneralSQL's new state and flags for limits.
func refundState(limits []Limit) (state, flags string) {
	var next, ok []string
	for i, l := range limits {
		s := func(o int) string { return fmt.Sprintf("old.state[%d]", 3*i+o) }
		anchor := fmt.Sprintf("($3::bigint[])[%d]", i+1)
		switch l.Algorithm {
		case GCRA:
			hit := fmt.Sprintf("%s = %s", s(1), anchor)
			next = append(next, fmt.Sprintf("CASE WHEN %s THEN %s - $4::bigint * ($5::bigint[])[%d] ELSE %s END", hit, s(1), i+1, s(1)), s(2), s(3))
			ok = append(ok, hit)
		case FixedWindow:
			hit := fmt.Sprintf("%s = %s", s(1), anchor)
			next = append(next, s(1), fmt.Sprintf("CASE WHEN %s THEN greatest(%s - $4::bigint, 0) ELSE %s END", hit, s(2), s(2)), s(3))
			ok = append(ok, hit)
		case SlidingWindow:
			// The units counted in the window that began at the anchor:
			// the current one, or the previous one once a window passed.
			P := l.Period.Microseconds()
			current := fmt.Sprintf("%s = %s", s(1), anchor)
			previous := fmt.Sprintf("%s = %s + %d", s(1), anchor, P)
			next = append(next, s(1),
				fmt.Sprintf("CASE WHEN %s THEN greatest(%s - $4::bigint, 0) ELSE %s END", previous, s(2), s(2)),
				fmt.Sprintf("CASE WHEN %s THEN greatest(%s - $4::bigint, 0) ELSE %s END", current, s(3), s(3)))
			ok = append(ok, fmt.Sprintf("(%s OR %s)", current, previous))
		}
	}
	return "ARRAY[" + strings.Join(next, ", ") + "]", "ARRAY[" + strings.Join(ok, ", ") + "]"
}

// refundStatement is a limiter's refund statement: refundSingleSQL for
// a single GCRA limit, refundGeneralSQL for others.
func refundStatement(limits []Limit, table string) string {
	if len(limits) == 1 && limits[0].Algorithm == GCRA {
		return fmt.Sprintf(refundSingleSQL, table)
	}
	state, flags := refundState(limits)
	return fmt.Sprintf(refundGeneralSQL, table, state, flags, 3*len(limits), len(limits))
}

// Refund gives back n of the units admission d took, when the work they
// paid for did not happen (see [Limiter.Refund]).
func (l *stmtLimiter) Refund(ctx context.Context, d Decision, n int) (bool, error) {
	t := d.refund
	switch {
	case l.refundSQL == "":
		return false, fmt.Errorf("%w: Refund on the %s strategy", ErrUnsupported, l.cfg.Strategy)
	case l.dist.Load() != nil:
		return false, fmt.Errorf("%w: Refund on a Citus distributed table", ErrUnsupported)
	case d.leased:
		return false, fmt.Errorf("%w: Refund of units served from a lease", ErrUnsupported)
	case t == nil || !d.Allowed || d.Shadow || d.Fallback:
		return false, fmt.Errorf("%w: Refund: the decision took no units from the database", ErrInvalidCost)
	case t.owner != &l.base:
		return false, fmt.Errorf("%w: Refund: the decision is another limiter's", ErrInvalidCost)
	case n <= 0:
		return false, fmt.Errorf("%w: Refund: n must be positive, got %d", ErrInvalidCost, n)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refunded+n > t.granted {
		return false, fmt.Errorf("%w: Refund: %d units, but %d of the %d granted are left to give back", ErrInvalidCost, n, t.granted-t.refunded, t.granted)
	}
	emissions := make([]int64, len(t.limits))
	for i, lim := range t.limits {
		emissions[i] = lim.emission()
	}
	args := []any{l.cfg.Namespace, t.key, t.anchors, int64(n), emissions}
	if len(t.limits) == 1 && t.limits[0].Algorithm == GCRA {
		args = []any{l.cfg.Namespace, t.key, t.anchors[0], int64(n) * emissions[0]}
	}
	ctx, cancel := context.WithTimeoutCause(ctx, l.cfg.Timeout, ErrTimeout)
	defer cancel()
	var took []bool
	err := l.db.QueryRow(ctx, l.refundSQL, args...).Scan(&took)
	if err != nil && noRowsAsUndecided(err) == nil {
		err, took = nil, make([]bool, len(t.limits)) // the key's row is gone or changed shape
	}
	if err != nil {
		return false, l.wrap(ctx, fmt.Errorf("refund: %w", err))
	}
	t.refunded += n
	all := true
	for i, ok := range took {
		all = all && ok
		if ok && t.limits[i].Algorithm == GCRA {
			t.anchors[i] -= int64(n) * emissions[i]
		}
	}
	if all {
		l.preblock.forget(t.key)
	}
	return all, nil
}

// withTicket is d, if it is an admission, with the refund ticket of its
// units of key, decided with limits and left at anchors.
func (b *base) withTicket(d Decision, key string, limits []Limit, anchors []int64) Decision {
	if d.Allowed && d.Granted > 0 {
		d.refund = &refundTicket{owner: b, key: key, limits: limits, granted: d.Granted, anchors: anchors}
	}
	return d
}
