package pglimit_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// A limit at the edge of what validation accepts either is refused by New
// (ErrInvalidConfig) or decides correctly: Burst*T of a GCRA limit with
// the largest burst and period (2^30 × 366 days in µs) does not fit 64
// bits, and no quantity may silently wrap or surface as a database error.
// Likewise a Reserve whose n*T overflows is ErrInvalidCost.
func TestLimitsArithmeticBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	const year = 366 * 24 * time.Hour
	huge := pglimit.Limit{Name: "huge", Rate: 1, Period: year, Burst: 1 << 30}
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		for _, tt := range []struct {
			name          string
			limits        []pglimit.Limit
			wantRemaining int // after one unit on a fresh key
		}{
			{"one GCRA limit", []pglimit.Limit{huge}, 1<<30 - 1},
			{"with a window", []pglimit.Limit{huge, {Name: "w", Rate: 5, Period: time.Second, Algorithm: pglimit.FixedWindow}}, 4},
		} {
			lim, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: schema, Limits: tt.limits, Namespace: string(s) + tt.name})
			if errors.Is(err, pglimit.ErrInvalidConfig) {
				continue // refusing such a limit is a fix too
			}
			if err != nil {
				t.Fatal(err)
			}
			if d, err := lim.AllowN(ctx, "k", 1); err != nil || !d.Allowed || d.Remaining != tt.wantRemaining {
				t.Errorf("%s, %s: AllowN(1) on a fresh key = %+v, %v; want admitted with Remaining %d", s, tt.name, d, err, tt.wantRemaining)
			}
			if d, err := lim.Peek(ctx, "k", 1); err != nil || !d.Allowed || d.Remaining != tt.wantRemaining-1 {
				t.Errorf("%s, %s: Peek(1) = %+v, %v; want admitted with Remaining %d", s, tt.name, d, err, tt.wantRemaining-1)
			}
			if d, err := lim.AllowAtMost(ctx, "k2", math.MaxInt); err != nil || !d.Allowed {
				t.Errorf("%s, %s: AllowAtMost(MaxInt) on a fresh key = %+v, %v; want admitted", s, tt.name, d, err)
			}
		}
		lim, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: schema, Limits: []pglimit.Limit{{Rate: 1, Period: 2 * time.Millisecond}}, Namespace: string(s) + "reserve"})
		if err != nil {
			t.Fatal(err)
		}
		if d, err := lim.Reserve(ctx, "k", 1<<62, 0); !errors.Is(err, pglimit.ErrInvalidCost) {
			t.Errorf("%s: Reserve(2^62, 0) with T = 2ms = %+v, %v; want ErrInvalidCost (2^62 × 2000µs wraps int64)", s, d, err)
		}
	}
}
