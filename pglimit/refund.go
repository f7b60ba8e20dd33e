package pglimit

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
)

// refundTicket is what an admission leaves for a refund: which key, how
// many units, and where it left each limit (evaluation.anchors), with the
// limits it was decided with. Copies of a Decision share it, so that its
// units are given back at most once.
type refundTicket struct {
	owner  *limiter
	key    string
	limits []Limit
	// xact is, for a decision in a caller's transaction, the id of the
	// (sub)transaction that wrote it (internal/queries, setting.xact): a
	// refund gives back only what it took once it committed. nil for a
	// decision in its own transaction, which committed before it was
	// returned.
	xact *string

	// mu guards the counts and anchors, never a statement: a refund
	// reserves its units (pending) and runs unlocked, so that no caller
	// waits for another's refund past its own deadline.
	mu       sync.Mutex
	granted  int
	refunded int
	pending  int
	anchors  []int64
	settled  bool // by Settle: no refund after it
}

// key is the key of the admission d, from its ticket; "" for a decision
// that took nothing.
func (d Decision) key() string {
	if d.refund == nil {
		return ""
	}
	return d.refund.key
}

// Refund gives back n of the units admission d took, when the work they
// paid for did not happen (see [Limiter.Refund]).
func (l *limiter) Refund(ctx context.Context, d Decision, n int) (ok bool, err error) {
	invalid := l.admitted(d, OpRefund)
	if invalid == nil && n <= 0 {
		invalid = fmt.Errorf("%w: Refund: n must be positive, got %d", ErrInvalidCost, n)
	}
	a := action{op: OpRefund, key: d.key(), n: n, invalid: invalid, decided: true, leased: d.leased}
	err = l.act(ctx, a, func(ctx context.Context) (err error) {
		ok, err = l.refund(ctx, d.refund, n)
		return err
	})
	return ok, err
}

// admitted checks that d, which op (Refund, Settle) gives back or
// settles, took units from the database, and is the limiter's.
func (l *limiter) admitted(d Decision, op Op) error {
	switch {
	case d.refund == nil || !d.Allowed || d.Shadow || d.Fallback:
		return fmt.Errorf("%w: %s: the decision took no units from the database", ErrNotAdmitted, op)
	case d.refund.owner != l:
		return fmt.Errorf("%w: %s: the decision is another limiter's", ErrForeignDecision, op)
	}
	return nil
}

// refund is Refund past the door, of n units of ticket t.
func (l *limiter) refund(ctx context.Context, t *refundTicket, n int) (bool, error) {
	emissions := make([]int64, len(t.limits))
	for i, lim := range t.limits {
		emissions[i] = lim.emission()
	}
	t.mu.Lock()
	if t.settled {
		t.mu.Unlock()
		return false, fmt.Errorf("%w: Refund: the decision was settled", ErrAlreadySettled)
	}
	// Compared as what is left, which cannot overflow: n + refunded can.
	// Then n <= granted, and n*T no more than the admission's own n*T.
	if left := t.granted - t.refunded - t.pending; n > left {
		t.mu.Unlock()
		return false, fmt.Errorf("%w: Refund: %d units, but %d of the %d granted are left to give back", ErrInvalidCost, n, left, t.granted)
	}
	t.pending += n
	args := []any{l.cfg.Namespace, t.key, slices.Clone(t.anchors), int64(n), emissions, t.xact}
	if len(t.limits) == 1 && t.limits[0].Algorithm == GCRA {
		args = []any{l.cfg.Namespace, t.key, t.anchors[0], int64(n) * emissions[0], t.xact}
	}
	t.mu.Unlock()
	var made *string // how the decision's transaction ended; nil: too old to tell
	var took []bool  // nil: no limit was asked to take the units back
	err := l.db.QueryRow(ctx, l.keySQL.Refund, args...).Scan(&made, &took)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending -= n
	switch {
	case err != nil && pgtx.UnknownOutcome(err):
		// The units may have been given back: they never are twice.
		t.refunded += n
		return false, failed(fmt.Errorf("refund, whose outcome is unknown: %w", err))
	case err != nil:
		return false, failed(fmt.Errorf("refund: %w", err))
	case made != nil && *made == "in progress":
		return false, fmt.Errorf("%w: Refund: the transaction of the decision has not ended; refund after it commits", ErrInvalidCost)
	}
	t.refunded += n
	all := took != nil
	for i, ok := range took {
		all = all && ok
		if ok && t.limits[i].Algorithm == GCRA {
			t.anchors[i] -= int64(n) * emissions[i]
		}
	}
	if all {
		l.preblock.Forget(t.key)
	}
	return all, nil
}

// withTicket is d, if it is an admission, with the refund ticket of its
// units of key, decided with limits and left at anchors.
func (l *limiter) withTicket(d Decision, key string, limits []Limit, anchors []int64) Decision {
	if d.Allowed && d.Granted > 0 {
		d.refund = &refundTicket{owner: l, key: key, limits: limits, granted: d.Granted, anchors: anchors}
	}
	return d
}
