package pglimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// limitSets are the sets of limits the tests below run on each strategy
// that supports them: every algorithm alone and several at once. Periods
// are long, so nothing replenishes during a test. Each set admits 3 units
// at once.
var limitSets = []struct {
	name   string
	limits []pglimit.Limit
}{
	{"gcra", []pglimit.Limit{{Rate: 3, Period: time.Hour, Burst: 3}}},
	{"gcra+gcra", []pglimit.Limit{{Name: "s", Rate: 3, Period: time.Hour, Burst: 3}, {Name: "d", Rate: 10, Period: 24 * time.Hour, Burst: 5}}},
	{"fixed", []pglimit.Limit{{Rate: 3, Period: time.Hour, Algorithm: pglimit.FixedWindow}}},
	// Sliding windows are aligned to multiples of Period since the epoch:
	// 366 days puts a boundary inside a test run once a year at most.
	{"sliding", []pglimit.Limit{{Rate: 3, Period: 366 * 24 * time.Hour, Algorithm: pglimit.SlidingWindow}}},
	{"gcra+fixed+sliding", []pglimit.Limit{
		{Name: "g", Rate: 3, Period: time.Hour, Burst: 3},
		{Name: "f", Rate: 4, Period: time.Hour, Algorithm: pglimit.FixedWindow},
		{Name: "s", Rate: 5, Period: 366 * 24 * time.Hour, Algorithm: pglimit.SlidingWindow},
	}},
}

func allGCRA(limits []pglimit.Limit) bool {
	for _, l := range limits {
		if l.Algorithm != pglimit.GCRA {
			return false
		}
	}
	return true
}

// xidAssigned reports whether tx has a transaction id: any row lock or
// write assigns one.
func xidAssigned(t *testing.T, tx pgx.Tx) bool {
	t.Helper()
	var xid *string
	if err := tx.QueryRow(context.Background(), "SELECT pg_current_xact_id_if_assigned()::text").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	return xid != nil
}

// TestRefusalWritesNothing for every algorithm and several limits at once:
// a refusal of AllowTxN, AllowAtMost and Reserve takes no row lock and
// writes nothing, and neither does Peek, admitting or refusing. The
// limiters run inside a transaction (a pgx.Tx is a pglimit.DB), which has
// no transaction id afterwards.
func TestRefusalWritesNothingGeneral(t *testing.T) {
	t.Parallel()
	type setup struct {
		strategy pglimit.Strategy
		name     string
		limits   []pglimit.Limit
	}
	var setups []setup
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		for _, ls := range limitSets {
			setups = append(setups, setup{s, ls.name, ls.limits})
		}
	}
	setups = append(setups, setup{pglimit.Range, "cooldown", []pglimit.Limit{{Rate: 2, Period: time.Hour, Burst: 1}}})
	for _, su := range setups {
		t.Run(string(su.strategy)+"/"+su.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			cfg := pglimit.Config{Strategy: su.strategy, Schema: testdb.Schema(t), Limits: su.limits}
			lim, err := pglimit.New(pool, &cfg)
			if err != nil {
				t.Fatal(err)
			}
			capacity := 3
			if su.strategy == pglimit.Range {
				capacity = 1
			}
			if d, err := lim.AllowN(ctx, "hot", capacity); err != nil || !d.Allowed {
				t.Fatalf("the burst: %+v, %v", d, err)
			}
			inTx := func(what string, f func(tx pgx.Tx) (pglimit.Decision, error), wantAllowed bool) {
				t.Helper()
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					d, err := f(tx)
					if err != nil {
						return fmt.Errorf("%s: %w", what, err)
					}
					if d.Allowed != wantAllowed {
						t.Errorf("%s: %+v, want Allowed %t", what, d, wantAllowed)
					}
					if xidAssigned(t, tx) {
						t.Errorf("%s (Allowed %t) assigned a transaction id: it locked or wrote", what, d.Allowed)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			over := func(tx pgx.Tx) pglimit.Limiter {
				l, err := pglimit.New(tx, &cfg)
				if err != nil {
					t.Fatal(err)
				}
				return l
			}
			inTx("AllowTxN refused", func(tx pgx.Tx) (pglimit.Decision, error) { return lim.AllowTxN(ctx, tx, "hot", 1) }, false)
			inTx("AllowAtMost refused", func(tx pgx.Tx) (pglimit.Decision, error) { return over(tx).AllowAtMost(ctx, "hot", 5) }, false)
			inTx("Peek refusing", func(tx pgx.Tx) (pglimit.Decision, error) { return over(tx).Peek(ctx, "hot", 1) }, false)
			inTx("Peek admitting a new key", func(tx pgx.Tx) (pglimit.Decision, error) { return over(tx).Peek(ctx, "cold", capacity) }, true)
			if su.strategy != pglimit.Range && allGCRA(su.limits) {
				inTx("Reserve refused", func(tx pgx.Tx) (pglimit.Decision, error) { return over(tx).Reserve(ctx, "hot", 1, time.Millisecond) }, false)
			}
		})
	}
}

// Concurrent first requests on a key never seen, within its burst, are all
// admitted: the ones that lose the race to insert the row decide again on
// a fresh snapshot instead of refusing. Upsert admits as many as the burst;
// NoWait refuses a request that finds the row locked, so it is held to
// two, where the loser finds the row inserted and committed.
func TestConcurrentFirstRequests(t *testing.T) {
	t.Parallel()
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		for _, ls := range limitSets {
			t.Run(string(s)+"/"+ls.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				pools := []*pgxpool.Pool{testdb.Pool(t), testdb.Pool(t)}
				schema := testdb.Schema(t)
				var lims []pglimit.Limiter
				for _, p := range pools {
					lim, err := pglimit.New(p, &pglimit.Config{Strategy: s, Schema: schema, Limits: ls.limits, Timeout: 30 * time.Second})
					if err != nil {
						t.Fatal(err)
					}
					lims = append(lims, lim)
				}
				concurrent := 3 // every set admits 3 units at once
				if s == pglimit.NoWait {
					concurrent = 2
				}
				const keys = 40
				var refused atomic.Int64
				for k := range keys {
					key := fmt.Sprintf("new-%d", k)
					var wg sync.WaitGroup
					start := make(chan struct{})
					for i := range concurrent {
						wg.Go(func() {
							<-start
							d, err := lims[i%2].Allow(ctx, key)
							if err != nil {
								t.Errorf("%s: %v", key, err)
							} else if !d.Allowed {
								refused.Add(1)
								t.Errorf("%s: request %d of %d concurrent first requests refused: %+v", key, i, concurrent, d)
							}
						})
					}
					close(start)
					wg.Wait()
				}
				t.Logf("%s %s: %d keys × %d concurrent first requests, %d refused", s, ls.name, keys, concurrent, refused.Load())
			})
		}
	}
}

// Several limits on many keys, hit by many goroutines over several pools in
// random order of keys, never deadlock: no error, and the whole run ends
// in bounded time.
func TestNoDeadlock(t *testing.T) {
	t.Parallel()
	limits := []pglimit.Limit{
		{Name: "g", Rate: 50, Period: time.Second, Burst: 3},
		{Name: "f", Rate: 10, Period: 100 * time.Millisecond, Algorithm: pglimit.FixedWindow},
		{Name: "s", Rate: 6, Period: 50 * time.Millisecond, Algorithm: pglimit.SlidingWindow},
	}
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			const (
				pools      = 3
				goroutines = 12
				keys       = 16
				rounds     = 8 // each goroutine visits every key this often
			)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			schema := testdb.Schema(t)
			var lims []pglimit.Limiter
			for range pools {
				lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Strategy: s, Schema: schema, Limits: limits, Timeout: 30 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				lims = append(lims, lim)
			}
			started := time.Now()
			var admitted, refused atomic.Int64
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 1))
					lim := lims[g%pools]
					for range rounds {
						for _, k := range rng.Perm(keys) {
							key := fmt.Sprintf("k%d", k)
							var d pglimit.Decision
							var err error
							if n := 1 + rng.IntN(3); rng.IntN(4) == 0 {
								d, err = lim.AllowAtMost(ctx, key, n)
							} else {
								d, err = lim.AllowN(ctx, key, n)
							}
							if err != nil {
								t.Errorf("%s: %v", key, err)
								return
							}
							if d.Allowed {
								admitted.Add(1)
							} else {
								refused.Add(1)
							}
						}
					}
				})
			}
			wg.Wait()
			took := time.Since(started)
			t.Logf("%s: %d pools × %d goroutines × %d keys × %d rounds: %d admitted, %d refused, no error, in %s",
				s, pools, goroutines, keys, rounds, admitted.Load(), refused.Load(), took.Round(time.Millisecond))
			if ctx.Err() != nil {
				t.Fatalf("not done within 2 minutes")
			}
		})
	}
}
