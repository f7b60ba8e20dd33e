package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// decided returns a function that fails t on a call's error, and returns
// its decision otherwise: must := decided(t); d := must(lim.Allow(ctx, k)).
func decided(t *testing.T) func(pglimit.Decision, error) pglimit.Decision {
	return func(d pglimit.Decision, err error) pglimit.Decision {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
}

// A GCRA limit takes units back exactly while nothing admitted since still
// counts, and never otherwise; a refund never gives back more than was
// taken, nor units of a refusal or of another limiter.
func TestRefundGCRA(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			must := decided(t)
			cfg := pglimit.Config{Schema: schema, Namespace: string(s), Strategy: s, Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 2}}}
			lim := newLimiterOn(t, testdb.Pool(t), cfg)
			d1 := must(lim.Allow(ctx, "k"))
			d2 := must(lim.Allow(ctx, "k"))
			refused := must(lim.Allow(ctx, "k"))
			if !d1.Allowed || !d2.Allowed || refused.Allowed {
				t.Fatalf("a burst of 2: %v %v %v", d1.Allowed, d2.Allowed, refused.Allowed)
			}
			if _, err := lim.Refund(ctx, refused, 1); !errors.Is(err, pglimit.ErrNotAdmitted) {
				t.Fatalf("Refund of a refusal: %v, want ErrNotAdmitted", err)
			}
			if _, err := lim.Refund(ctx, d2, 2); !errors.Is(err, pglimit.ErrInvalidCost) {
				t.Fatalf("Refund of 2 units of an admission of 1: %v, want ErrInvalidCost", err)
			}
			other := newLimiterOn(t, testdb.Pool(t), cfg)
			if _, err := other.Refund(ctx, d2, 1); !errors.Is(err, pglimit.ErrForeignDecision) {
				t.Fatalf("Refund through another limiter: %v, want ErrForeignDecision", err)
			}

			// d2 was the last admission: exact.
			if ok, err := lim.Refund(ctx, d2, 1); err != nil || !ok {
				t.Fatalf("Refund of the last admission: %v, %v; want given back", ok, err)
			}
			if _, err := lim.Refund(ctx, d2, 1); !errors.Is(err, pglimit.ErrInvalidCost) {
				t.Fatalf("a second Refund of the same unit: %v, want ErrInvalidCost", err)
			}
			if d := must(lim.Allow(ctx, "k")); !d.Allowed {
				t.Fatalf("after the refund: %+v, want the unit back", d)
			}
			// d1 is followed by an admission that still counts: giving d1
			// back could leave the key better off than without it.
			if ok, err := lim.Refund(ctx, d1, 1); err != nil || ok {
				t.Fatalf("Refund of an admission another followed: %v, %v; want not given back", ok, err)
			}
			if d := must(lim.Allow(ctx, "k")); d.Allowed {
				t.Fatalf("after a refund that gave nothing back: %+v, want refused", d)
			}
		})
	}
}

// One misuse gets one sentinel, whether it is refunded or settled: a
// refusal, or a zero Decision (which admitted nothing either), is
// ErrNotAdmitted; another limiter's decision, even one of the same Config,
// ErrForeignDecision. Neither is ErrInvalidCost, and nothing is written.
func TestRefundSettleMisuse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	must := decided(t)
	pool := testdb.Pool(t)
	cfg := pglimit.Config{Schema: testdb.Schema(t), Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 1}}}
	lim := newLimiterOn(t, pool, cfg)
	twin := newLimiterOn(t, pool, cfg)
	admitted := must(lim.Allow(ctx, "k"))
	refused := must(lim.Allow(ctx, "k"))
	if !admitted.Allowed || refused.Allowed {
		t.Fatalf("a burst of 1: %+v, %+v", admitted, refused)
	}
	sentinels := []error{pglimit.ErrNotAdmitted, pglimit.ErrForeignDecision, pglimit.ErrInvalidCost}
	for _, op := range []struct {
		name string
		call func(pglimit.Limiter, pglimit.Decision) error
	}{
		{"Refund", func(l pglimit.Limiter, d pglimit.Decision) error { _, err := l.Refund(ctx, d, 1); return err }},
		{"Settle", func(l pglimit.Limiter, d pglimit.Decision) error { _, err := pglimit.Settle(ctx, l, d, 0); return err }},
	} {
		for _, tc := range []struct {
			name string
			lim  pglimit.Limiter
			d    pglimit.Decision
			want error
		}{
			{"a refusal", lim, refused, pglimit.ErrNotAdmitted},
			{"another limiter's decision", twin, admitted, pglimit.ErrForeignDecision},
			{"a zero Decision", lim, pglimit.Decision{}, pglimit.ErrNotAdmitted},
		} {
			err := op.call(tc.lim, tc.d)
			for _, s := range sentinels {
				if errors.Is(err, s) != (s == tc.want) {
					t.Errorf("%s of %s: %v, want %v alone", op.name, tc.name, err, tc.want)
					break
				}
			}
		}
	}
	// Nothing was written: the admission is still there to give back.
	if ok, err := lim.Refund(ctx, admitted, 1); err != nil || !ok {
		t.Fatalf("Refund of the admission after the misuses: %t, %v; want its unit back", ok, err)
	}
}

// Windows take units back within the window they were counted in,
// whatever was admitted since; a decision of several limits reports
// whether every one did.
func TestRefundWindows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	must := decided(t)
	lim := newLimiterOn(t, testdb.Pool(t), pglimit.Config{Schema: testdb.Schema(t), Limits: []pglimit.Limit{
		{Name: "burst", Rate: 100, Period: time.Minute, Burst: 10},
		{Name: "daily", Rate: 3, Algorithm: pglimit.FixedWindow, Calendar: "day"},
		{Name: "hourly", Rate: 3, Period: time.Hour, Algorithm: pglimit.SlidingWindow},
	}})
	var ds []pglimit.Decision
	for range 3 {
		ds = append(ds, must(lim.Allow(ctx, "k")))
	}
	if d := must(lim.Allow(ctx, "k")); d.Allowed {
		t.Fatalf("the fourth of a daily 3: %+v", d)
	}
	// The first admission is followed by two others: the GCRA limit keeps
	// its units, the windows give them back.
	if ok, err := lim.Refund(ctx, ds[0], 1); err != nil || ok {
		t.Fatalf("Refund of the first: %v, %v; want false (GCRA keeps it)", ok, err)
	}
	d := must(lim.Allow(ctx, "k"))
	if !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after the windows gave a unit back: %+v, want admitted with none left", d)
	}
	if ok, err := lim.Refund(ctx, d, 1); err != nil || !ok {
		t.Fatalf("Refund of the last admission: %v, %v; want every limit to take it back", ok, err)
	}
	// Peek's Remaining is what an admission would leave.
	if p := must(lim.Peek(ctx, "k", 1)); !p.Allowed || p.Remaining != 0 {
		t.Fatalf("Peek after the refunds: %+v, want one unit left", p)
	}
}

// Two instances admit and refund on one key at once: the key's count is
// always exactly the admissions not given back, never more than the
// quota, and a GCRA limit's state exactly what they left.
func TestRefundRaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	for name, l := range map[string]pglimit.Limit{
		"window": {Name: "daily", Rate: 10, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
		"gcra":   {Name: "hourly", Rate: 1, Period: time.Hour, Burst: 10},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := pglimit.Config{Schema: schema, Namespace: name, Limits: []pglimit.Limit{l}}
			lims := []pglimit.Limiter{newLimiterOn(t, testdb.Pool(t), cfg), newLimiterOn(t, testdb.Pool(t), cfg)}
			var mu sync.Mutex
			admitted, refunded := 0, 0
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Go(func() {
					lim := lims[i%2]
					rng := rand.New(rand.NewPCG(uint64(i), 7))
					for range 30 {
						d, err := lim.Allow(ctx, "k")
						if err != nil {
							t.Error(err)
							return
						}
						if !d.Allowed {
							continue
						}
						back := false
						if rng.IntN(2) == 0 {
							if back, err = lim.Refund(ctx, d, 1); err != nil {
								t.Error(err)
								return
							}
						}
						mu.Lock()
						admitted++
						if back {
							refunded++
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			must := decided(t)
			held := admitted - refunded
			if held > 10 {
				t.Fatalf("%d admitted, %d given back: %d held, more than the quota of 10", admitted, refunded, held)
			}
			// Peek's Remaining is what one more admission would leave.
			d := must(lims[0].Peek(ctx, "k", 1))
			if (held < 10) != d.Allowed || (d.Allowed && d.Remaining != 9-held) {
				t.Fatalf("%d admitted, %d given back: Peek %+v; want %d units left", admitted, refunded, d, 10-held)
			}
			if refunded == 0 {
				t.Log("no refund took its units back")
			}
		})
	}
}

// A decision made in a caller's transaction is refunded once it has
// committed; one rolled back has nothing to give back. Range does not
// refund.
func TestRefundAfterTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	must := decided(t)
	pool := testdb.Pool(t)
	lim := newLimiterOn(t, pool, pglimit.Config{Schema: testdb.Schema(t), Cooldown: time.Hour})
	for _, commit := range []bool{false, true} {
		var d pglimit.Decision
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d, err = lim.AllowTx(ctx, tx, "k"); err != nil || !d.Allowed {
			t.Fatalf("AllowTx: %+v, %v", d, err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		ok, err := lim.Refund(ctx, d, 1)
		if err != nil || ok != commit {
			t.Fatalf("Refund after commit=%t: %v, %v; want %t", commit, ok, err, commit)
		}
	}
	if d := must(lim.Allow(ctx, "k")); !d.Allowed {
		t.Fatalf("after the committed admission was refunded: %+v, want admitted", d)
	}
	rng := newLimiterOn(t, pool, pglimit.Config{Schema: testdb.Schema(t), Strategy: pglimit.Range, Cooldown: time.Hour})
	d := must(rng.Allow(ctx, "k"))
	if _, err := rng.Refund(ctx, d, 1); !errors.Is(err, pglimit.ErrUnsupported) {
		t.Fatalf("Refund on Range: %v, want ErrUnsupported", err)
	}
}

// refundLimits are one limit of each kind, and several at once, with a
// quota of 5 that nothing replenishes within a test.
var refundLimits = map[string][]pglimit.Limit{
	"fixed":    {{Name: "hourly", Rate: 5, Period: time.Hour, Algorithm: pglimit.FixedWindow}},
	"sliding":  {{Name: "hourly", Rate: 5, Period: time.Hour, Algorithm: pglimit.SlidingWindow}},
	"calendar": {{Name: "daily", Rate: 5, Algorithm: pglimit.FixedWindow, Calendar: "day"}},
	"gcra":     {{Name: "hourly", Rate: 5, Period: time.Hour, Burst: 5}},
	"several": {
		{Name: "burst", Rate: 5, Period: time.Hour, Burst: 5},
		{Name: "daily", Rate: 5, Algorithm: pglimit.FixedWindow, Calendar: "day"},
		{Name: "hourly", Rate: 5, Period: time.Hour, Algorithm: pglimit.SlidingWindow},
	},
}

// admissions counts the units lim admits on key, one at a time, until it
// refuses; shadow admissions consume nothing and do not count.
func admissions(t *testing.T, lim pglimit.Limiter, key string) int {
	t.Helper()
	ctx := context.Background()
	for n := 0; ; n++ {
		d, err := lim.Allow(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Shadow || n > 20 {
			return n
		}
	}
}

// A decision made in a caller's transaction that did not commit took
// nothing, so a refund of it gives nothing back: not after a rollback,
// not when an admission after the rollback left the key as the decision
// had, and not after a rollback to a savepoint around it in a transaction
// that then committed. One that committed is given back. The caller's
// transaction runs at READ COMMITTED and at REPEATABLE READ, on Upsert and
// NoWait.
func TestRefundAfterRollback(t *testing.T) {
	t.Parallel()
	schema := testdb.Schema(t)
	for name, limits := range refundLimits {
		for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
			t.Run(name+"/"+string(s), func(t *testing.T) {
				t.Parallel()
				refundAfterRollback(t, pglimit.Config{Schema: schema, Namespace: name + "/" + string(s), Strategy: s, Limits: limits})
			})
		}
	}
}

// refundAfterRollback is TestRefundAfterRollback for one limiter.
func refundAfterRollback(t *testing.T, cfg pglimit.Config) {
	ctx := context.Background()
	ends := []struct {
		name   string
		end    func(tx pgx.Tx) error
		allow  bool // one more admission after the transaction
		refund bool // what Refund reports
		left   int  // units admitted after the refund, of 5
	}{
		{"rollback", func(tx pgx.Tx) error { return tx.Rollback(ctx) }, false, false, 3},
		{"rollback, then an admission", func(tx pgx.Tx) error { return tx.Rollback(ctx) }, true, false, 2},
		{"rollback to a savepoint", func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT work"); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}, false, false, 3},
		{"commit", func(tx pgx.Tx) error { return tx.Commit(ctx) }, false, true, 3},
	}
	must := decided(t)
	pool := testdb.Pool(t)
	lim := newLimiterOn(t, pool, cfg)
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		for _, e := range ends {
			key := fmt.Sprintf("%s/%s", iso, e.name)
			must(lim.Allow(ctx, key))
			must(lim.Allow(ctx, key))
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "SAVEPOINT work"); err != nil {
				t.Fatal(err)
			}
			d, err := lim.AllowTx(ctx, tx, key)
			if err != nil || !d.Allowed {
				t.Fatalf("%s: AllowTx: %+v, %v", key, d, err)
			}
			if err := e.end(tx); err != nil {
				t.Fatal(err)
			}
			if e.allow {
				if d := must(lim.Allow(ctx, key)); !d.Allowed {
					t.Fatalf("%s: the third admission: %+v", key, d)
				}
			}
			if ok, err := lim.Refund(ctx, d, 1); err != nil || ok != e.refund {
				t.Fatalf("%s: Refund: %v, %v; want %t", key, ok, err, e.refund)
			}
			if n := admissions(t, lim, key); n != e.left {
				t.Fatalf("%s: %d admitted after the refund, want %d", key, n, e.left)
			}
		}
	}
}

// A refund while the decision's transaction is still open cannot know
// whether it will commit: it is an error that changes nothing, returned
// without waiting for the lock the transaction holds on the key's row,
// and the same refund after the commit gives the units back.
func TestRefundOpenTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	for name, limits := range refundLimits {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := testdb.Pool(t)
			lim := newLimiterOn(t, pool, pglimit.Config{Schema: schema, Namespace: name, Limits: limits, Timeout: 5 * time.Second})
			if d := decided(t)(lim.Allow(ctx, "k")); !d.Allowed {
				t.Fatalf("the first admission: %+v", d)
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			d, err := lim.AllowTx(ctx, tx, "k")
			if err != nil || !d.Allowed {
				t.Fatalf("AllowTx: %+v, %v", d, err)
			}
			start := time.Now()
			if ok, err := lim.Refund(ctx, d, 1); !errors.Is(err, pglimit.ErrInvalidCost) || ok {
				t.Fatalf("Refund while the transaction is open: %v, %v; want ErrInvalidCost", ok, err)
			}
			if waited := time.Since(start); waited > time.Second {
				t.Fatalf("Refund while the transaction is open took %s: it waited for the row lock", waited)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if ok, err := lim.Refund(ctx, d, 1); err != nil || !ok {
				t.Fatalf("Refund after the commit: %v, %v; want given back", ok, err)
			}
			if n := admissions(t, lim, "k"); n != 4 {
				t.Fatalf("%d admitted after the refund, want 4", n)
			}
		})
	}
}

// Shadow mode lets a refusal through as an admission that consumed
// nothing: refunding it is an error and gives nothing back, in or out of
// a caller's transaction.
func TestRefundShadow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	for name, limits := range refundLimits {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			must := decided(t)
			pool := testdb.Pool(t)
			lim := newLimiterOn(t, pool, pglimit.Config{Schema: schema, Namespace: name, Limits: limits, Shadow: true})
			if n := admissions(t, lim, "k"); n != 5 {
				t.Fatalf("%d admitted for real, want 5", n)
			}
			shadowed := must(lim.Allow(ctx, "k"))
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			inTx, err := lim.AllowTx(ctx, tx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			for _, d := range []pglimit.Decision{shadowed, inTx} {
				if !d.Allowed || !d.Shadow {
					t.Fatalf("past the quota in shadow mode: %+v, want a shadow admission", d)
				}
				if ok, err := lim.Refund(ctx, d, 1); !errors.Is(err, pglimit.ErrNotAdmitted) || ok {
					t.Fatalf("Refund of a shadow admission: %v, %v; want ErrNotAdmitted", ok, err)
				}
			}
			if n := admissions(t, lim, "k"); n != 0 {
				t.Fatalf("%d admitted for real after the refunds of shadow admissions, want 0", n)
			}
		})
	}
}

// Refund never gives back more units than the decision took, however
// large n is: n = math.MaxInt after a first refund once passed a guard
// that overflowed, and with it every later refund.
func TestRefundOverflow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	for name, limits := range refundLimits {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			must := decided(t)
			lim := newLimiterOn(t, testdb.Pool(t), pglimit.Config{Schema: schema, Namespace: name, Limits: limits})
			d := must(lim.AllowN(ctx, "k", 2))
			if ok, err := lim.Refund(ctx, d, 1); err != nil || !ok {
				t.Fatalf("Refund of 1 of 2: %v, %v; want given back", ok, err)
			}
			for _, n := range []int{math.MaxInt, math.MaxInt - 1, 2} {
				if ok, err := lim.Refund(ctx, d, n); !errors.Is(err, pglimit.ErrInvalidCost) || ok {
					t.Fatalf("Refund of %d with 1 unit left: %v, %v; want ErrInvalidCost", n, ok, err)
				}
			}
			if ok, err := lim.Refund(ctx, d, 1); err != nil || !ok {
				t.Fatalf("Refund of the last unit: %v, %v; want given back", ok, err)
			}
			for range 5 {
				if ok, err := lim.Refund(ctx, d, 1); !errors.Is(err, pglimit.ErrInvalidCost) || ok {
					t.Fatalf("Refund with nothing left: %v, %v; want ErrInvalidCost", ok, err)
				}
			}
			if n := admissions(t, lim, "k"); n != 5 {
				t.Fatalf("%d admitted after the refunds, want the quota, 5", n)
			}
		})
	}
}

// Two instances, each on its own pool, admit in callers' transactions
// that commit or roll back at random (at READ COMMITTED or REPEATABLE
// READ) and refund at random on one key: a refund of a rolled-back
// decision gives nothing back, and afterwards exactly the quota less the
// committed admissions not given back is admitted.
func TestRefundTwoPools(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	for name, limits := range refundLimits {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := pglimit.Config{Schema: schema, Namespace: name, Limits: limits, Timeout: 10 * time.Second}
			pools := []*pgxpool.Pool{testdb.Pool(t), testdb.Pool(t)}
			lims := []pglimit.Limiter{newLimiterOn(t, pools[0], cfg), newLimiterOn(t, pools[1], cfg)}
			var mu sync.Mutex
			held := 0
			var wg sync.WaitGroup
			for i := range 6 {
				wg.Go(func() {
					pool, lim := pools[i%2], lims[i%2]
					rng := rand.New(rand.NewPCG(uint64(i), 11))
					for range 12 {
						iso := pgx.ReadCommitted
						if rng.IntN(2) == 0 {
							iso = pgx.RepeatableRead
						}
						tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
						if err != nil {
							t.Error(err)
							return
						}
						d, err := lim.AllowTx(ctx, tx, "k")
						commit := rng.IntN(2) == 0
						if err == nil && commit {
							err = tx.Commit(ctx)
						} else {
							err = errors.Join(err, tx.Rollback(ctx))
						}
						if err != nil {
							t.Error(err)
							return
						}
						if !d.Allowed {
							continue
						}
						back := false
						if rng.IntN(2) == 0 {
							if back, err = lim.Refund(ctx, d, 1); err != nil {
								t.Error(err)
								return
							}
						}
						if back && !commit {
							t.Errorf("a refund of a rolled-back decision gave its unit back")
						}
						mu.Lock()
						if commit && !back {
							held++
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			if held > 5 {
				t.Fatalf("%d committed admissions not given back, more than the quota of 5", held)
			}
			if n := admissions(t, lims[0], "k"); n != 5-held {
				t.Fatalf("%d committed admissions not given back: %d admitted after, want %d", held, n, 5-held)
			}
		})
	}
}
