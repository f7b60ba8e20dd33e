package pglimit

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
)

// Settlement is what [Settle] did.
type Settlement struct {
	// Returned is how many units were given back, of those the estimate
	// exceeded the cost by, on the limit that took back the most. A limit
	// takes back only units it still counts (as [Limiter.Refund] does):
	// none once the admission's window has ended or, for GCRA, the part
	// still ahead of now, rounded up to whole units. 0 when no limit
	// counted them any more.
	Returned int
	// Charged is how many units the cost exceeded the estimate by and
	// were charged: at most what the key's limits admitted at the settle
	// plus their [Limit.Debt].
	Charged int
	// Forgiven is the rest of the excess, which the debt cap left
	// uncharged.
	Forgiven int
}

// maxSettleCost bounds a settle's cost, as maxRate bounds a limit's.
const maxSettleCost = maxRate

// Settle settles admission d of lim at cost, its real cost, by giving
// back or charging the difference from d's estimate.
//
// Call it once the work d paid for has told its cost: it gives back the
// units d's estimate (its Granted) exceeded cost by, or charges those cost
// exceeded it by. A charge may put the key into debt, up to each limit's
// [Limit.Debt]: the key is then refused until the debt is repaid at the
// limit's rate, and what the cap does not allow is forgiven (docs/limits.md,
// "Settling with debt").
//
// A decision settles once ([ErrAlreadySettled]), by the limiter that made
// it: the value [New] returned, not another of the same Config, in this
// process or on another instance ([ErrForeignDecision]). It settles only
// if it took units from the database ([ErrNotAdmitted]: a refusal, a
// shadow or fallback admission, a zero Decision, or one in a caller's
// transaction that rolled back, which took nothing and is charged
// nothing). [Limiter.Refund] of a refusal, a zero Decision or another
// limiter's decision returns the same sentinel as Settle. A decision in
// a caller's transaction settles once it committed; before, Settle
// returns [ErrInvalidCost] and the decision stays unsettled. cost must
// not be negative ([ErrInvalidCost]). Settle takes a decision of the
// Upsert or NoWait strategy, not served from a lease nor on a Citus
// distributed table ([ErrUnsupported]).
//
// A fallback admission ([Decision.Fallback], made in process by
// [Config.Fallback] while the database was unavailable) never settles,
// during the outage or after it: its units came from the fallback's count
// in this process, which the database never saw and which ends with the
// outage, so Settle returns [ErrNotAdmitted] at any cost and changes
// neither that count nor the key's row. The work's real cost is not
// charged anywhere, nor anything given back.
//
// A settle whose outcome is unknown (its connection lost, or its backend
// terminated, after it was sent) is not run again, and the decision
// counts as settled ([ErrAlreadySettled] from then on): the difference is
// given back or charged once or not at all, never twice. Its error says
// that the outcome is unknown, and wraps [ErrUnavailable] (or
// [ErrTimeout], when Timeout cut the statement off).
func Settle(ctx context.Context, lim Limiter, d Decision, cost int) (out Settlement, err error) {
	l, err := made(lim, "Settle")
	if err != nil {
		return Settlement{}, err
	}
	invalid := l.admitted(d, OpSettle)
	if invalid == nil && (cost < 0 || cost > maxSettleCost) {
		invalid = fmt.Errorf("%w: Settle: cost must be in [0, %d], got %d", ErrInvalidCost, maxSettleCost, cost)
	}
	a := action{op: OpSettle, key: d.key(), n: cost, invalid: invalid, decided: true, leased: d.leased}
	err = l.act(ctx, a, func(ctx context.Context) (err error) {
		out, err = l.settleDecision(ctx, d.refund, cost)
		return err
	})
	return out, err
}

// settleDecision is Settle past the door, of ticket t at cost.
func (l *limiter) settleDecision(ctx context.Context, t *refundTicket, cost int) (Settlement, error) {
	t.mu.Lock()
	switch {
	case t.settled:
		t.mu.Unlock()
		return Settlement{}, fmt.Errorf("%w: Settle: the decision was settled before", ErrAlreadySettled)
	case t.pending > 0:
		t.mu.Unlock()
		return Settlement{}, fmt.Errorf("%w: Settle: a Refund of the decision has not returned", ErrInvalidCost)
	}
	estimate := t.granted - t.refunded
	back, charge := int64(max(estimate-cost, 0)), int64(max(cost-estimate, 0))
	if back == 0 && charge == 0 && t.xact == nil {
		// The estimate was right, and the admission committed.
		t.settled = true
		t.mu.Unlock()
		return Settlement{}, nil
	}
	t.settled = true
	rates, ts, bts := make([]int64, len(t.limits)), make([]int64, len(t.limits)), make([]int64, len(t.limits))
	for i, lim := range t.limits {
		_, rates[i], ts[i], bts[i] = lim.micros()
	}
	args := []any{l.cfg.Namespace, t.key, slices.Clone(t.anchors), back, charge, t.xact, rates, ts, bts}
	t.mu.Unlock()
	out, err := l.settle(ctx, t, l.keySQL.Settle, args)
	switch {
	case err == nil:
		if out.Returned > 0 {
			l.preblock.Forget(t.key)
		}
		return out, nil
	case errors.Is(err, ErrNotAdmitted): // settled: there is nothing to settle
		return Settlement{}, err
	case !errors.Is(err, ErrInvalidCost) && pgtx.UnknownOutcome(err):
		// It may have settled: it never does twice.
		return Settlement{}, failed(fmt.Errorf("settle, whose outcome is unknown: %w", err))
	}
	t.mu.Lock()
	t.settled = false // nothing was written: the caller may settle again
	t.mu.Unlock()
	return Settlement{}, failed(err)
}

// settle runs the settle statement sql (settle or settle.id) with args
// (see settle.sql) for ticket t, inserting a blank row first for a key
// that has none, and checks the database's arithmetic against
// arith.Settle on the same row.
func (l *limiter) settle(ctx context.Context, t *refundTicket, sql string, args []any) (Settlement, error) {
	anchors, charge := args[2].([]int64), args[4].(int64)
	for range 2 {
		var (
			status           *string
			state, newState  []int64
			tat, now, newTAT *int64
			backed, units    *int64
		)
		if err := l.db.QueryRow(ctx, sql, args...).Scan(&status, &state, &tat, &now, &backed, &units, &newState, &newTAT); err != nil {
			return Settlement{}, unknownZone(l.cfg.Limits, err)
		}
		switch {
		case status != nil && *status == "aborted":
			return Settlement{}, fmt.Errorf("%w: Settle: the decision's transaction rolled back, so it took nothing and is charged nothing", ErrNotAdmitted)
		case status != nil && *status == "in progress":
			return Settlement{}, fmt.Errorf("%w: Settle: the transaction of the decision has not ended; settle after it commits", ErrInvalidCost)
		case now == nil && charge == 0:
			return Settlement{}, nil // no row: nothing counts the units any more
		case now == nil:
			// A key with no row (reset, or cleaned) is charged on a blank
			// one, which means the same as none.
			if _, err := l.db.Exec(ctx, l.keySQL.Blank, l.cfg.Namespace, t.key); err != nil {
				return Settlement{}, err
			}
			continue
		case newTAT == nil:
			return Settlement{}, fmt.Errorf("settle: the key's row was found but not written: a bug; please report it")
		}
		wantState, wantTAT, want := arith.Settle(specs(t.limits), state, tat, *now, anchors, *backed, charge)
		if *units != want || *newTAT != wantTAT || !slices.Equal(newState, wantState) {
			return Settlement{}, fmt.Errorf("settle: the database left %v, %d charging %d; the library computes %v, %d charging %d on the same row: a bug; please report it",
				newState, *newTAT, *units, wantState, wantTAT, want)
		}
		returned := arith.Returned(specs(t.limits), state, tat, *now, anchors, *backed)
		return Settlement{Returned: int(returned), Charged: int(want), Forgiven: int(charge - want)}, nil
	}
	return Settlement{}, fmt.Errorf("settle: the key's row kept disappearing")
}
