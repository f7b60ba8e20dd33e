package arith_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/pglimit/cooldown/internal/testdb"
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
	const second = int64(1_000_000)
	var admissions, refusals int
	for seq := range 40 {
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
