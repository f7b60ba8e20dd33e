package arith_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/internal/arith"
)

// DecisionSQL decides as Evaluate does: random limits, costs, modes and
// gaps, each decision made by the SQL on the state the SQL left, and
// checked against Evaluate on the same state. (The model test checks
// both against docs/limits.md through the limiter.)
func TestDecisionSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	rng := rand.New(rand.NewPCG(uint64(testSeed), 7))
	var admissions, refusals int
	for seq := range 40 {
		limits := randomLimits(rng)
		stmt := make(map[arith.Mode]string)
		for _, mode := range []arith.Mode{arith.Allow, arith.AtMost, arith.Reserve} {
			if mode == arith.Reserve && !arith.AllGCRA(limits) {
				continue
			}
			admits, state, expires := arith.DecisionSQL(limits, mode, "x.state", "x.tat", "x.now", nil)
			stmt[mode] = fmt.Sprintf(`SELECT %s, %s, %s FROM (SELECT %s AS state, $2::bigint AS tat, $3::bigint AS now) AS x`,
				admits, state, expires, arith.Shaped(limits, "$1::bigint[]"))
		}
		var state []int64
		var tat *int64
		now := int64(1_800_000_000) * second
		for step := range 30 {
			now += int64(rng.IntN(int(3 * second)))
			modes := []arith.Mode{arith.Allow, arith.AtMost, arith.Reserve}
			mode := modes[rng.IntN(len(modes))]
			if _, ok := stmt[mode]; !ok {
				mode = arith.Allow
			}
			n := int64(1 + rng.IntN(4))
			maxDelay := int64(rng.IntN(int(2 * second)))
			var admitted bool
			var newState []int64
			var newTAT int64
			args := []any{state, tat, now, n}
			if mode == arith.Reserve {
				args = append(args, maxDelay) // $5 appears in Reserve's statement only
			} else {
				maxDelay = 0
			}
			if err := pool.QueryRow(ctx, stmt[mode], args...).Scan(&admitted, &newState, &newTAT); err != nil {
				t.Fatalf("sequence %d step %d: %v", seq, step, err)
			}
			e := arith.Evaluate(limits, state, tat, now, n, mode, maxDelay)
			if admitted != e.Allowed {
				t.Fatalf("sequence %d step %d (%+v, mode %d, n %d, state %v, tat %v): the SQL admits %t, Evaluate %t",
					seq, step, limits, mode, n, state, tat, admitted, e.Allowed)
			}
			if admitted {
				admissions++
				wantState, wantTAT := arith.Admit(limits, state, tat, now, e.Granted)
				if !slices.Equal(newState, wantState) || newTAT != wantTAT {
					t.Fatalf("sequence %d step %d (%+v, n %d, state %v, tat %v): the SQL leaves %v, %d; Admit %v, %d",
						seq, step, limits, n, state, tat, newState, newTAT, wantState, wantTAT)
				}
				state, tat = newState, &newTAT
			} else {
				refusals++
			}
		}
	}
	if admissions < 100 || refusals < 100 {
		t.Errorf("%d admissions and %d refusals: the sequences do not reach both", admissions, refusals)
	}
}

const second = int64(1_000_000)

// randomLimits returns one to three limits of any algorithm, of up to 20
// units a minute.
func randomLimits(rng *rand.Rand) []arith.Limit {
	limits := make([]arith.Limit, 1+rng.IntN(3))
	for i := range limits {
		period := second * int64(1+rng.IntN(60))
		rate := int64(1 + rng.IntN(20))
		l := arith.Limit{Algorithm: arith.Algorithm(rng.IntN(3)), Period: period, Rate: rate, T: (period + rate - 1) / rate}
		if l.Algorithm == arith.GCRA {
			l.BurstT = int64(1+rng.IntN(int(rate))) * l.T
		}
		limits[i] = l
	}
	return limits
}

// BatchSQL admits, of calls requests of n units, those that Evaluate
// admits one after the other on the state each leaves, and leaves the row
// as they do: random limits, costs, numbers of calls and gaps, each batch
// decided by the SQL on the state the SQL left.
func TestBatchSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	rng := rand.New(rand.NewPCG(uint64(testSeed), 8))
	var partial, whole, none int
	for seq := range 40 {
		limits := randomLimits(rng)
		count, guard, state, expires := arith.BatchSQL(limits, "x.state", "x.tat", "x.now", "x.n", "x.calls", "g.granted", nil)
		stmt := fmt.Sprintf(`SELECT g.granted, %s, %s, %s FROM (SELECT %s AS state, $2::bigint AS tat, $3::bigint AS now, $4::bigint AS n, $5::bigint AS calls) AS x
			CROSS JOIN LATERAL (SELECT %s AS granted) AS g`, guard, state, expires, arith.Shaped(limits, "$1::bigint[]"), count)
		var st []int64
		var tat *int64
		now := int64(1_800_000_000) * second
		for step := range 20 {
			now += int64(rng.IntN(int(3 * second)))
			n, calls := int64(1+rng.IntN(3)), int64(1+rng.IntN(6))
			var granted int64
			var first bool
			var newState []int64
			var newTAT int64
			if err := pool.QueryRow(ctx, stmt, st, tat, now, n, calls).Scan(&granted, &first, &newState, &newTAT); err != nil {
				t.Fatalf("sequence %d step %d: %v", seq, step, err)
			}
			// Evaluate, call after call, on the state each admission leaves.
			want, wantState, wantTAT := int64(0), st, tat
			for range calls {
				if !arith.Evaluate(limits, wantState, wantTAT, now, n, arith.Allow, 0).Allowed {
					break
				}
				var e int64
				wantState, e = arith.Admit(limits, wantState, wantTAT, now, n)
				wantTAT, want = &e, want+1
			}
			if granted != want || first != (want > 0) {
				t.Fatalf("sequence %d step %d (%+v, %d calls of %d, state %v): the SQL admits %d (first %t), Evaluate %d",
					seq, step, limits, calls, n, st, granted, first, want)
			}
			switch {
			case granted == 0:
				none++
				continue
			case granted == calls:
				whole++
			default:
				partial++
			}
			if !slices.Equal(newState, wantState) || newTAT != *wantTAT {
				t.Fatalf("sequence %d step %d (%+v, %d of %d calls of %d): the SQL leaves %v, %d; one by one, %v, %d",
					seq, step, limits, granted, calls, n, newState, newTAT, wantState, *wantTAT)
			}
			st, tat = newState, &newTAT
		}
	}
	if partial < 50 || whole < 50 || none < 50 {
		t.Errorf("%d batches admitted in part, %d whole, %d none: the sequences do not reach each", partial, whole, none)
	}
}

// SettleSQL settles as Settle does, and the decisions after a settle (a
// window's debt carried into the next among them) as Evaluate does:
// random limits with debt, decisions and settles that give back or charge
// past the estimate, each made by the SQL on the state the SQL left.
func TestSettleSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	rng := rand.New(rand.NewPCG(uint64(testSeed), 11))
	var given, charged, forgiven, refusedInDebt int
	for seq := range 60 {
		limits := randomLimits(rng)
		for i := range limits {
			limits[i].Debt = int64(rng.IntN(int(limits[i].Rate) + 1))
			if limits[i].Algorithm == arith.FixedWindow && rng.IntN(3) == 0 {
				limits[i].Period = 60 * second
				limits[i].T = (limits[i].Period + limits[i].Rate - 1) / limits[i].Rate
				limits[i].Calendar = &arith.Calendar{Unit: "minute", Zone: "UTC", Loc: time.UTC}
			}
		}
		params := func(i int) (string, string, string) {
			n := strconv.Itoa(i + 1)
			return "($7::bigint[])[" + n + "]", "($8::bigint[])[" + n + "]", "($9::bigint[])[" + n + "]"
		}
		admits, state, expires := arith.DecisionSQL(limits, arith.Allow, "x.state", "x.tat", "x.now", nil)
		decide := fmt.Sprintf(`SELECT %s, %s, %s FROM (SELECT %s AS state, $2::bigint AS tat, $3::bigint AS now) AS x`,
			admits, state, expires, arith.Shaped(limits, "$1::bigint[]"))
		units, newState, newExpires := arith.SettleSQL(limits, "x.state", "x.tat", "x.now", "$4::bigint[]", "$5::bigint", "$6::bigint", "x.units", params)
		settle := fmt.Sprintf(`SELECT x.units, %s, %s FROM (SELECT x.*, %s AS units FROM (SELECT %s AS state, $2::bigint AS tat, $3::bigint AS now) AS x) AS x
			WHERE cardinality($7::bigint[]) + cardinality($8::bigint[]) + cardinality($9::bigint[]) >= 0`,
			newState, newExpires, units, arith.Shaped(limits, "$1::bigint[]"))
		var rates, ts, bts []int64
		for _, l := range limits {
			rates, ts, bts = append(rates, l.Rate), append(ts, l.T), append(bts, l.BurstT)
		}
		var st []int64
		var tat *int64
		var last *arith.Evaluation
		now := int64(1_800_000_000) * second
		for step := range 40 {
			now += int64(rng.IntN(int(4 * second)))
			where := fmt.Sprintf("sequence %d step %d (%+v, state %v, tat %v, now %d)", seq, step, limits, st, tat, now)
			if last != nil && rng.IntN(2) == 0 {
				back, charge := int64(0), int64(0)
				if rng.IntN(2) == 0 {
					back = 1 + int64(rng.IntN(int(last.Granted)))
				} else {
					charge = 1 + int64(rng.IntN(30))
				}
				var got, gotTAT int64
				var gotState []int64
				if err := pool.QueryRow(ctx, settle, st, tat, now, last.Anchors, back, charge, rates, ts, bts).Scan(&got, &gotState, &gotTAT); err != nil {
					t.Fatalf("%s: settle: %v", where, err)
				}
				wantState, wantTAT, want := arith.Settle(limits, st, tat, now, last.Anchors, back, charge)
				if got != want || !slices.Equal(gotState, wantState) || gotTAT != wantTAT {
					t.Fatalf("%s: settling back %d, charge %d: the SQL charges %d and leaves %v, %d; Settle %d, %v, %d",
						where, back, charge, got, gotState, gotTAT, want, wantState, wantTAT)
				}
				given += int(min(back, 1))
				charged += int(got)
				forgiven += int(charge - got)
				st, tat, last = gotState, &gotTAT, nil
				continue
			}
			n := int64(1 + rng.IntN(3))
			var admitted bool
			var newSt []int64
			var newTAT int64
			if err := pool.QueryRow(ctx, decide, st, tat, now, n).Scan(&admitted, &newSt, &newTAT); err != nil {
				t.Fatalf("%s: decide: %v", where, err)
			}
			e := arith.Evaluate(limits, st, tat, now, n, arith.Allow, 0)
			if admitted != e.Allowed {
				t.Fatalf("%s: n %d: the SQL admits %t, Evaluate %t", where, n, admitted, e.Allowed)
			}
			if !admitted {
				if arith.Owed(limits, st, tat, now) > 0 {
					refusedInDebt++
				}
				continue
			}
			wantState, wantTAT := arith.Admit(limits, st, tat, now, e.Granted)
			if !slices.Equal(newSt, wantState) || newTAT != wantTAT {
				t.Fatalf("%s: n %d: the SQL leaves %v, %d; Admit %v, %d", where, n, newSt, newTAT, wantState, wantTAT)
			}
			st, tat, last = newSt, &newTAT, &e
		}
	}
	if given < 50 || charged < 50 || forgiven < 50 || refusedInDebt < 50 {
		t.Errorf("%d give-backs, %d units charged, %d forgiven, %d refusals in debt: the sequences do not reach every case",
			given, charged, forgiven, refusedInDebt)
	}
	t.Logf("%d give-backs, %d units charged, %d forgiven, %d refusals in debt", given, charged, forgiven, refusedInDebt)
}
