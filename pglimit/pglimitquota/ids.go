package pglimitquota

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
)

// Refund is what [Quota.RefundID] gave back, or what [Quota.SettleID] of
// a cost below the admission's gave back.
type Refund struct {
	// Units is how many units were to be given back.
	Units int64
	// FromAllowance, FromCredits and Overage are the units given back to
	// the allowance, to credits and off the overage.
	FromAllowance, FromCredits, Overage int64
	// Kept is the rest of Units, which stays charged: the allowance and
	// overage part once the admission's period is no longer the key's
	// current one, and credit units whose credit expired or found no room
	// (the key holding [MaxCredits] live credits).
	Kept int64
	// Usage is the key's period right after.
	Usage Usage
}

// Settlement is what [Quota.SettleID] did.
type Settlement struct {
	// Estimate is the cost the admission charged; Cost, the one settled.
	Estimate, Cost int64
	// Returned is what a Cost below the Estimate gave back: Estimate −
	// Cost units, as RefundID gives them back. Zero otherwise.
	Returned Refund
	// FromAllowance, FromCredits and Overage split the excess of a Cost
	// above the Estimate that was charged, as an Allow would charge it
	// now; Forgiven is the rest of the excess, past the hard cap, which
	// was not. Zero otherwise.
	FromAllowance, FromCredits, Overage, Forgiven int64
	// Usage is the key's period right after.
	Usage Usage
}

// ticket is an id's row: its first admission, rebuilt, and what a
// refund or settle of it needs.
type ticket struct {
	first                Decision
	key                  string
	periodStart, decided time.Time
	creditUnits          []int64     // units taken from each credit, in take order
	creditExpires        []time.Time // those credits' expiries
	done                 *string     // "refunded" or "settled"; nil before
}

// lookup reads the row of id on db, if any.
func (q *Quota) lookup(ctx context.Context, db pglimit.DB, id string) (ticket, bool, error) {
	var t ticket
	var a []int64
	d := &t.first
	u := &d.Usage
	err := db.QueryRow(ctx, q.stmts.lookupID, q.cfg.Namespace, id).Scan(&t.key, &a, &u.PeriodStart, &u.PeriodEnd, &t.decided,
		&t.creditUnits, &t.creditExpires, &t.done)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ticket{}, false, nil
	case err != nil:
		return ticket{}, false, q.wrap(ctx, "look up id", err)
	case len(a) != 10 || len(t.creditUnits) != len(t.creditExpires):
		return ticket{}, false, fmt.Errorf("pglimit: quota: the id's row has %d numbers and %d/%d credits, not 10 and as many expiries as units", len(a), len(t.creditUnits), len(t.creditExpires))
	}
	d.Allowed, d.Replayed = true, true
	d.Cost, d.FromAllowance, d.FromCredits, d.Overage = a[0], a[1], a[2], a[3]
	u.FromAllowance, u.FromCredits, u.Overage, u.Allowance, u.HardCap, u.CreditsLeft = a[4], a[5], a[6], a[7], a[8], a[9]
	u.Used = u.FromAllowance + u.FromCredits + u.Overage
	u.Now, t.periodStart = t.decided, u.PeriodStart
	return t, true, nil
}

// ticketOf is the row of id, which op is to refund or settle: an id
// with no admission stored is ErrNotAdmitted, one refunded or settled
// ErrAlreadySettled.
func (q *Quota) ticketOf(ctx context.Context, op, id string) (ticket, error) {
	t, found, err := q.lookup(ctx, q.db, id)
	switch {
	case err != nil:
		return ticket{}, err
	case !found:
		return ticket{}, fmt.Errorf("%w: %s: no admission has the id %q", pglimit.ErrNotAdmitted, op, id)
	case t.done != nil:
		return ticket{}, fmt.Errorf("%w: %s: the admission of id %q was %s", pglimit.ErrAlreadySettled, op, id, *t.done)
	}
	return t, nil
}

// unmarked is the error of op, whose statement found the row of id that
// its lookup read neither unmarked nor the same: another call refunded or
// settled it (ErrAlreadySettled), or the row was deleted after its
// retention or by Forget, and maybe the id admitted again, meanwhile
// (ErrNotAdmitted).
func (q *Quota) unmarked(ctx context.Context, op, id string) error {
	t, found, err := q.lookup(ctx, q.db, id)
	switch {
	case err != nil:
		return err
	case found && t.done != nil:
		return fmt.Errorf("%w: %s: the admission of id %q was %s by another call", pglimit.ErrAlreadySettled, op, id, *t.done)
	}
	return fmt.Errorf("%w: %s: the admission of id %q was deleted meanwhile (after its retention, or by Forget)", pglimit.ErrNotAdmitted, op, id)
}

// RefundID gives back n of the units the admission of decision id id
// ([pglimit.WithID]) took, from any instance with the same Config, at
// most once.
//
// The id's row in the database is the refund's ticket, not a Decision
// value: a process that did not make the decision may refund it, and the
// key is the admission's. The units go back the way they were taken, in
// reverse: off the admission's overage first, then to the credits it
// took from (the last taken first, each to a live credit of the same
// expiry, else to a credit of its own while the key holds fewer than
// [MaxCredits] live credits), then to the allowance. The allowance and
// overage part goes back only while the admission's period is still the
// key's current one, and a credit's part only while that credit has not
// expired; the rest stays charged (Refund.Kept). The period's counters
// drop by what went back while it is current; no threshold event is
// written or taken back. docs/limits.md, "Billing periods", defines it.
//
// A second RefundID or a SettleID of the id, here or on another
// instance, even racing the first, gives back nothing and is
// [pglimit.ErrAlreadySettled]. An id with no admission stored (never
// admitted, refused, admitted by an AllowTx whose transaction has not
// committed or rolled back, deleted after IDRetention, or its key
// forgotten by [Quota.Forget]) is
// [pglimit.ErrNotAdmitted]; n not from 1 to the admission's cost,
// [pglimit.ErrInvalidCost]; an invalid id, [pglimit.ErrInvalidID]. None
// writes anything. A RefundID whose outcome is unknown may have refunded:
// a retry of it then reports ErrAlreadySettled. It runs in a transaction
// of its own on the quota's db.
func (q *Quota) RefundID(ctx context.Context, id string, n int64) (Refund, error) {
	if err := pglimit.ValidateID(id); err != nil {
		return Refund{}, err
	}
	if n < 1 || n > MaxUnits {
		return Refund{}, fmt.Errorf("%w: RefundID: n must be from 1 to the admission's cost, got %d", pglimit.ErrInvalidCost, n)
	}
	ctx, cancel := q.bound(ctx)
	defer cancel()
	t, err := q.ticketOf(ctx, "RefundID", id)
	if err != nil {
		return Refund{}, err
	}
	if n > t.first.Cost {
		return Refund{}, fmt.Errorf("%w: RefundID: %d units, but the admission of id %q took %d", pglimit.ErrInvalidCost, n, id, t.first.Cost)
	}
	return q.refund(ctx, "RefundID", id, t, n, "refunded")
}

// refund gives back n units of t's admission, of id, and marks its row
// done; op names the call.
func (q *Quota) refund(ctx context.Context, op, id string, t ticket, n int64, done string) (Refund, error) {
	d := t.first
	bo := min(n, d.Overage)
	bc := min(n-bo, d.FromCredits)
	ba := n - bo - bc
	var units []int64
	var expires []time.Time
	for i := len(t.creditUnits) - 1; i >= 0 && bc > 0; i-- {
		u := min(bc, t.creditUnits[i])
		units, expires = append(units, u), append(expires, t.creditExpires[i])
		bc -= u
	}
	params := append(q.head(t.key), id, t.decided, t.periodStart, ba, bo, units, expires, done, int32(MaxCredits))
	r := Refund{Units: n}
	u := &r.Usage
	var marked bool
	err := q.db.QueryRow(ctx, q.stmts.refund, params...).Scan(&marked, &r.FromAllowance, &r.FromCredits, &r.Overage,
		&u.FromAllowance, &u.FromCredits, &u.Overage, &u.Allowance, &u.HardCap, &u.CreditsLeft, &u.PeriodStart, &u.PeriodEnd, &u.Now)
	switch {
	case err != nil:
		return Refund{}, q.wrap(ctx, "refund by id", err)
	case !marked:
		return Refund{}, q.unmarked(ctx, op, id)
	}
	r.Kept = n - r.FromAllowance - r.FromCredits - r.Overage
	u.Used = u.FromAllowance + u.FromCredits + u.Overage
	return r, nil
}

// SettleID settles at its real cost the admission of decision id id
// ([pglimit.WithID]), from any instance with the same Config, at most
// once.
//
// The admission's cost was an estimate. The id's row is the ticket, as
// for [Quota.RefundID]. A cost below the admission's gives back the
// difference as RefundID gives it back; a cost above it charges the
// excess now, to the key's current period, as an Allow of it would
// (allowance, then credits, then overage), except that the overage stops
// at the hard cap instead of refusing: the rest is forgiven
// (Settlement.Forgiven), and a threshold it crosses writes its event. An
// equal cost only marks the id settled.
//
// A second SettleID or a RefundID of the id, here or on another
// instance, even racing the first, does nothing and is
// [pglimit.ErrAlreadySettled], as is a SettleID after a RefundID. An id
// with no admission stored is [pglimit.ErrNotAdmitted]; a cost not from 0
// to [MaxUnits], [pglimit.ErrInvalidCost]; an invalid id,
// [pglimit.ErrInvalidID]. None writes anything. A SettleID whose outcome
// is unknown may have settled: a retry of it then reports
// ErrAlreadySettled. It runs in a transaction of its own on the quota's
// db.
func (q *Quota) SettleID(ctx context.Context, id string, cost int64) (Settlement, error) {
	if err := pglimit.ValidateID(id); err != nil {
		return Settlement{}, err
	}
	if cost < 0 || cost > MaxUnits {
		return Settlement{}, fmt.Errorf("%w: SettleID: cost must be from 0 to %d, got %d", pglimit.ErrInvalidCost, int64(MaxUnits), cost)
	}
	ctx, cancel := q.bound(ctx)
	defer cancel()
	t, err := q.ticketOf(ctx, "SettleID", id)
	if err != nil {
		return Settlement{}, err
	}
	out := Settlement{Estimate: t.first.Cost, Cost: cost}
	if cost <= t.first.Cost {
		r, err := q.refund(ctx, "SettleID", id, t, t.first.Cost-cost, "settled")
		if err != nil {
			return Settlement{}, err
		}
		out.Returned, out.Usage = r, r.Usage
		return out, nil
	}
	excess := cost - t.first.Cost
	params := append(q.head(t.key), excess, id, t.decided, q.thresholds)
	for range maxAttempts {
		var marked, taken bool
		u := &out.Usage
		err := q.db.QueryRow(ctx, q.stmts.settle, params...).Scan(&marked, &taken,
			&out.FromAllowance, &out.FromCredits, &out.Overage,
			&u.FromAllowance, &u.FromCredits, &u.Overage, &u.Allowance, &u.HardCap,
			&u.CreditsLeft, &u.PeriodStart, &u.PeriodEnd, &u.Now)
		switch {
		case err == nil && marked:
			out.Forgiven = excess - out.FromAllowance - out.FromCredits - out.Overage
			u.Used = u.FromAllowance + u.FromCredits + u.Overage
			return out, nil
		case err == nil:
			return Settlement{}, q.unmarked(ctx, "SettleID", id)
		case pgtx.Code(err) != pgtx.CodeUniqueViolation:
			return Settlement{}, q.wrap(ctx, "settle by id", err)
		}
		// The key had no row, and a concurrent first decision of it
		// inserted one: the statement was undone.
	}
	return Settlement{}, q.wrap(ctx, "settle by id", errors.New("the key's row kept changing"))
}
