package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// debtLimits are 10 a minute with a debt of 5, by each algorithm, and when
// a key that settled 15 units into a window of its own (the clock at a
// minute's start) may pass again: GCRA once the 5 owed and 1 more have
// dripped back (6 emission intervals of 6 s); a fixed window at its end,
// the next one starting with the 5 owed; a sliding window 36 s into the
// next window, where the previous window's 10 weigh 4 and the 5 owed
// count.
var debtLimits = []struct {
	limit pglimit.Limit
	after time.Duration
}{
	{pglimit.Limit{Name: "gcra", Rate: 10, Period: time.Minute, Burst: 10, Debt: 5}, 36 * time.Second},
	{pglimit.Limit{Name: "fixed", Rate: 10, Period: time.Minute, Algorithm: pglimit.FixedWindow, Debt: 5}, time.Minute},
	{pglimit.Limit{Name: "calendar", Rate: 10, Algorithm: pglimit.FixedWindow, Calendar: "minute", Debt: 5}, time.Minute},
	{pglimit.Limit{Name: "sliding", Rate: 10, Period: time.Minute, Algorithm: pglimit.SlidingWindow, Debt: 5}, 96 * time.Second},
}

// A settle gives back what the estimate exceeded the cost by, and charges
// what the cost exceeded it by, up to the debt cap, forgiving the rest;
// the key is then refused until the debt is repaid at the limit's rate,
// to the microsecond, by each algorithm, on both row strategies.
func TestSettleDebt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		for _, dl := range debtLimits {
			t.Run(string(s)+"/"+dl.limit.Name, func(t *testing.T) {
				t.Parallel()
				clock := pglimittest.NewClock(t)
				clock.Set(clock.Now().Truncate(time.Minute).Add(time.Hour))
				cfg := pglimit.Config{Schema: testdb.Schema(t), Strategy: s, Limits: []pglimit.Limit{dl.limit}}
				lim := newLimiterOn(t, clock.Pool(t), cfg)
				allow := func(n int) pglimit.Decision {
					t.Helper()
					d, err := lim.AllowN(ctx, "k", n)
					if err != nil {
						t.Fatal(err)
					}
					return d
				}
				settle := func(d pglimit.Decision, cost int, want pglimit.Settlement) {
					t.Helper()
					got, err := pglimit.Settle(ctx, lim, d, cost)
					if err != nil || got != want {
						t.Fatalf("Settle at cost %d of %d granted: %+v, %v; want %+v", cost, d.Granted, got, err, want)
					}
				}
				settle(allow(4), 1, pglimit.Settlement{Returned: 3})
				if d := allow(4); d.Remaining != 5 {
					t.Fatalf("after a settle gave 3 of 4 back and 4 more: %d left, want 5", d.Remaining)
				} else {
					// 11 past the estimate: 5 left and 5 of debt are charged.
					settle(d, 15, pglimit.Settlement{Charged: 10, Forgiven: 1})
				}
				if d := allow(1); d.Allowed {
					t.Fatalf("in debt: %+v, want a refusal", d)
				}
				clock.Advance(dl.after - time.Microsecond)
				if d := allow(1); d.Allowed {
					t.Fatalf("%s after the settle, 1 µs before the debt is repaid: %+v, want a refusal", dl.after-time.Microsecond, d)
				}
				clock.Advance(time.Microsecond)
				if dl.limit.Algorithm == pglimit.FixedWindow {
					// The next window starts owing 5: 5 of its 10 are left.
					if d := allow(6); d.Allowed {
						t.Fatalf("the window after the debt: 6 admitted, want 5 left")
					}
					if d := allow(5); !d.Allowed {
						t.Fatalf("the window after the debt: %+v, want 5 left", d)
					}
					return
				}
				if d := allow(1); !d.Allowed {
					t.Fatalf("%s after the settle, the debt repaid: %+v, want admitted", dl.after, d)
				}
			})
		}
	}
}

// A settle reports what it gave back: nothing once no limit counts the
// admission's units any more (its window has ended, its GCRA time has
// passed), and for GCRA the units still ahead of now, rounded up.
func TestSettleReturnedAfterItsWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		limit    pglimit.Limit
		after    time.Duration
		returned int
	}{
		{pglimit.Limit{Name: "gcra", Rate: 5, Period: time.Minute, Burst: 5}, 2 * time.Minute, 0},
		{pglimit.Limit{Name: "gcra-half", Rate: 5, Period: time.Minute, Burst: 5}, 54 * time.Second, 1}, // 6 s of the last unit's 12 left
		{pglimit.Limit{Name: "fixed", Rate: 5, Period: time.Minute, Algorithm: pglimit.FixedWindow}, 2 * time.Minute, 0},
		{pglimit.Limit{Name: "calendar", Rate: 5, Algorithm: pglimit.FixedWindow, Calendar: "minute"}, 2 * time.Minute, 0},
		{pglimit.Limit{Name: "sliding", Rate: 5, Period: time.Minute, Algorithm: pglimit.SlidingWindow}, 2 * time.Minute, 0},
		{pglimit.Limit{Name: "sliding-previous", Rate: 5, Period: time.Minute, Algorithm: pglimit.SlidingWindow}, time.Minute, 4}, // the previous window still weighs
	} {
		t.Run(tc.limit.Name, func(t *testing.T) {
			t.Parallel()
			clock := pglimittest.NewClock(t)
			clock.Set(clock.Now().Truncate(time.Minute).Add(time.Hour))
			lim := newLimiterOn(t, clock.Pool(t), pglimit.Config{Schema: testdb.Schema(t), Limits: []pglimit.Limit{tc.limit}})
			d, err := lim.AllowN(ctx, "k", 5)
			if err != nil || !d.Allowed {
				t.Fatalf("AllowN(5): %+v, %v", d, err)
			}
			clock.Advance(tc.after)
			got, err := pglimit.Settle(ctx, lim, d, 1)
			if err != nil || got != (pglimit.Settlement{Returned: tc.returned}) {
				t.Fatalf("Settle at 1 of 5, %s after the admission: %+v, %v; want Returned %d", tc.after, got, err, tc.returned)
			}
		})
	}
}

// Settling twice, another limiter's decision (another instance's of the
// same Config among them), a refusal, a shadow
// admission, a negative cost, and a Refund after a settle are typed
// errors, and none changes the key.
func TestSettleErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	cfg := pglimit.Config{Schema: schema, Namespace: "a", Limits: []pglimit.Limit{{Rate: 3, Period: time.Hour, Burst: 3, Debt: 2}}}
	lim := newLimiterOn(t, pool, cfg)
	other := newLimiterOn(t, pool, pglimit.Config{Schema: schema, Namespace: "b", Limits: cfg.Limits})
	// Another instance: the same Config on a pool of its own.
	twin := newLimiterOn(t, testdb.Pool(t), cfg)
	shadowCfg := cfg
	shadowCfg.Namespace, shadowCfg.Shadow = "s", true
	shadow := newLimiterOn(t, pool, shadowCfg)

	d, err := lim.AllowN(ctx, "k", 3)
	if err != nil || !d.Allowed {
		t.Fatalf("AllowN: %+v, %v", d, err)
	}
	refused, err := lim.Allow(ctx, "k")
	if err != nil || refused.Allowed {
		t.Fatalf("Allow past the burst: %+v, %v", refused, err)
	}
	shadow.AllowN(ctx, "k", 3) //nolint:errcheck // uses the burst up
	shadowed, err := shadow.Allow(ctx, "k")
	if err != nil || !shadowed.Shadow {
		t.Fatalf("a shadow admission: %+v, %v", shadowed, err)
	}
	for _, tc := range []struct {
		name string
		lim  pglimit.Limiter
		d    pglimit.Decision
		cost int
		want error
	}{
		{"another limiter's", other, d, 1, pglimit.ErrForeignDecision},
		{"another instance's limiter of the same Config", twin, d, 1, pglimit.ErrForeignDecision},
		{"a refusal", lim, refused, 1, pglimit.ErrNotAdmitted},
		{"a shadow admission", shadow, shadowed, 1, pglimit.ErrNotAdmitted},
		{"a zero decision", lim, pglimit.Decision{}, 1, pglimit.ErrNotAdmitted},
		{"a negative cost", lim, d, -1, pglimit.ErrInvalidCost},
		{"a huge cost", lim, d, 1 << 40, pglimit.ErrInvalidCost},
	} {
		if _, err := pglimit.Settle(ctx, tc.lim, tc.d, tc.cost); !errors.Is(err, tc.want) {
			t.Errorf("Settle of %s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if got := left(t, pool, cfg, "k"); got != 0 {
		t.Fatalf("after refused settles: %d left, want 0, the key unchanged", got)
	}
	if s, err := pglimit.Settle(ctx, lim, d, 1); err != nil || s.Returned != 2 {
		t.Fatalf("Settle at 1 of 3: %+v, %v", s, err)
	}
	if _, err := pglimit.Settle(ctx, lim, d, 0); !errors.Is(err, pglimit.ErrAlreadySettled) {
		t.Errorf("a second Settle: %v, want ErrAlreadySettled", err)
	}
	if _, err := lim.Refund(ctx, d, 1); !errors.Is(err, pglimit.ErrAlreadySettled) {
		t.Errorf("Refund after Settle: %v, want ErrAlreadySettled", err)
	}
	if got := left(t, pool, cfg, "k"); got != 2 {
		t.Errorf("after one settle and refused ones: %d left, want 2", got)
	}
}

// In a caller's transaction: an admission rolled back took nothing, and
// settling it is ErrNotAdmitted and charges nothing; one still open
// cannot settle yet (and stays unsettled); once committed it settles.
func TestSettleTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	cfg := pglimit.Config{Schema: testdb.Schema(t), Limits: []pglimit.Limit{{Rate: 10, Period: time.Hour, Burst: 10, Debt: 5}}}
	lim := newLimiterOn(t, pool, cfg)
	inTx := func() (pglimit.Decision, func(commit bool)) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		d, err := lim.AllowTxN(ctx, tx, "k", 2)
		if err != nil || !d.Allowed {
			t.Fatalf("AllowTxN: %+v, %v", d, err)
		}
		return d, func(commit bool) {
			if commit {
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				return
			}
			tx.Rollback(ctx) //nolint:errcheck // the test checks the key
		}
	}
	d, end := inTx()
	end(false)
	if _, err := pglimit.Settle(ctx, lim, d, 7); !errors.Is(err, pglimit.ErrNotAdmitted) {
		t.Errorf("Settle of a rolled-back admission: %v, want ErrNotAdmitted", err)
	}
	if got := left(t, pool, cfg, "k"); got != 10 {
		t.Fatalf("after settling a rolled-back admission: %d left, want 10: nothing charged", got)
	}
	d, end = inTx()
	if _, err := pglimit.Settle(ctx, lim, d, 7); !errors.Is(err, pglimit.ErrInvalidCost) {
		t.Errorf("Settle while its transaction is open: %v, want ErrInvalidCost", err)
	}
	end(true)
	if s, err := pglimit.Settle(ctx, lim, d, 7); err != nil || s.Charged != 5 {
		t.Fatalf("Settle at 7 of 2 once committed: %+v, %v; want 5 charged", s, err)
	}
	if got := left(t, pool, cfg, "k"); got != 3 {
		t.Errorf("after a committed admission of 2 settled at 7: %d left, want 3", got)
	}
}

// Two instances, one through PgBouncer, admit and settle at random costs
// on one key of a fixed window of 40 an hour with a debt of 10: every
// settle's charge and give-back is applied exactly once (the window's
// count is the sum of what the calls report), and the count never passes
// the limit plus its debt.
func TestSettleConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	const rate, debt = 40, 10
	cfg := pglimit.Config{Schema: schema, Limits: []pglimit.Limit{{Rate: rate, Period: time.Hour, Algorithm: pglimit.FixedWindow, Debt: debt}}}
	pool := testdb.Pool(t)
	instances := []pglimit.Limiter{newLimiterOn(t, pool, cfg), newLimiterOn(t, testdb.PgBouncerPool(t), cfg)}
	var (
		net, calls, charged, returned atomic.Int64
		wg                            sync.WaitGroup
	)
	for w := range 8 {
		lim := instances[w%2]
		wg.Go(func() {
			for range 20 {
				d, err := lim.AllowN(ctx, "k", 2)
				if err != nil {
					t.Errorf("AllowN: %v", err)
					return
				}
				if !d.Allowed {
					continue
				}
				calls.Add(1)
				cost := rand.IntN(6)
				s, err := pglimit.Settle(ctx, lim, d, cost)
				if err != nil {
					t.Errorf("Settle: %v", err)
					return
				}
				if s.Returned+s.Charged+s.Forgiven != max(cost-2, 2-cost) {
					t.Errorf("Settle at %d of 2: %+v does not add up", cost, s)
				}
				charged.Add(int64(s.Charged))
				returned.Add(int64(s.Returned))
				net.Add(int64(2 - s.Returned + s.Charged))
			}
		})
	}
	wg.Wait()
	var count int64
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT state[2] FROM %q.pglimit_upsert WHERE key = 'k'`, schema)).Scan(&count); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d admissions settled: %d units given back, %d charged; the window counts %d", calls.Load(), returned.Load(), charged.Load(), count)
	if count != net.Load() {
		t.Errorf("the window counts %d, the calls report %d: a settle was lost or applied twice", count, net.Load())
	}
	if count > rate+debt {
		t.Errorf("the window counts %d, past the limit %d plus the debt %d", count, rate, debt)
	}
	if charged.Load() == 0 || returned.Load() == 0 {
		t.Errorf("%d charged and %d given back: the test reached neither case", charged.Load(), returned.Load())
	}
}

// A fallback admission (Decision.Fallback, made in process while the
// database was unavailable) took no units from the database: Settle of it
// is ErrNotAdmitted, at any cost, during the outage and after it, runs no
// statement, and changes neither the fallback's count in this process nor
// the key's row.
func TestSettleFallbackDecision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	proxy, pcfg := testdb.NewStallProxy(t)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var logs syncBuffer
	cfg := fallbackConfig(testdb.Schema(t), &logs) // 100 a key in the database, 5 in process
	lim := newLimiterOn(t, pool, cfg)
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed || d.Fallback {
		t.Fatalf("Allow with the database up: %+v, %v", d, err)
	}

	proxy.Stall()
	d, err := lim.Allow(ctx, "k")
	if err != nil || !d.Allowed || !d.Fallback {
		t.Fatalf("Allow with the database stalled: %+v, %v; want an in-process admission", d, err)
	}
	for _, cost := range []int{0, 1, 50} {
		if _, err := pglimit.Settle(ctx, lim, d, cost); !errors.Is(err, pglimit.ErrNotAdmitted) {
			t.Fatalf("Settle at %d of a fallback admission: %v, want ErrNotAdmitted", cost, err)
		}
	}
	// The fallback's burst of 5, one of which d took: 4 more pass.
	for i := range 5 {
		next, err := lim.Allow(ctx, "k")
		if err != nil || !next.Fallback || next.Allowed != (i < 4) {
			t.Fatalf("in-process call %d after the settles: %+v, %v; want %d of them admitted: the settles gave nothing back to the fallback", i+2, next, err, 4)
		}
	}

	proxy.Unstall()
	waitForDatabase(t, lim)
	if _, err := pglimit.Settle(ctx, lim, d, 0); !errors.Is(err, pglimit.ErrNotAdmitted) {
		t.Fatalf("Settle of a fallback admission once the database is back: %v, want ErrNotAdmitted", err)
	}
	// Each of the 6 calls on k during the outage may have sent a statement
	// that its timeout cut off and the server ran once the proxy let it
	// through: charged at most once, as any call whose outcome is unknown.
	// A settle at 50 would have charged 49 more.
	if got := left(t, pool, cfg, "k"); got > 99 || got < 99-6 {
		t.Fatalf("after the outage: %d left of 100, want 93 to 99: the admission before it, and at most one unit for each call during it", got)
	}
}
