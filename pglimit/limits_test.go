package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/testdb"
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

// Every invalid limit or config is ErrInvalidConfig from New, every invalid
// cost ErrInvalidCost (or ErrUnsupported for Reserve where it does not
// apply), and none of them writes anything.
func TestLimitsBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	ok := pglimit.Limit{Rate: 5, Period: time.Second, Burst: 5}
	nine := make([]pglimit.Limit, pglimit.MaxLimits+1)
	for i := range nine {
		nine[i] = pglimit.Limit{Name: fmt.Sprintf("l%d", i), Rate: 1, Period: time.Second}
	}
	for _, tt := range []struct {
		name string
		cfg  pglimit.Config
	}{
		{"Cooldown and Limits", pglimit.Config{Cooldown: time.Second, Limits: []pglimit.Limit{ok}}},
		{"neither", pglimit.Config{}},
		{"empty Limits", pglimit.Config{Limits: []pglimit.Limit{}}},
		{"negative Cooldown", pglimit.Config{Cooldown: -time.Second}},
		{"Cooldown over 366 days", pglimit.Config{Cooldown: 366*24*time.Hour + time.Microsecond}},
		{"Rate 0", pglimit.Config{Limits: []pglimit.Limit{{Period: time.Second}}}},
		{"negative Rate", pglimit.Config{Limits: []pglimit.Limit{{Rate: -1, Period: time.Second}}}},
		{"Rate over 2^30", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1<<30 + 1, Period: 366 * 24 * time.Hour, Algorithm: pglimit.FixedWindow}}}},
		{"negative Burst", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: time.Second, Burst: -1}}}},
		{"Burst over 2^30", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: time.Second, Burst: 1<<30 + 1}}}},
		{"Burst on a fixed window", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: time.Second, Burst: 1, Algorithm: pglimit.FixedWindow}}}},
		{"Burst on a sliding window", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: time.Second, Burst: 2, Algorithm: pglimit.SlidingWindow}}}},
		{"Period 0", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1}}}},
		{"negative Period", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: -time.Second}}}},
		{"Period under 1ms", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: time.Millisecond - time.Microsecond}}}},
		{"Period over 366 days", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: 366*24*time.Hour + time.Microsecond}}}},
		{"more than one per µs", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1001, Period: time.Millisecond}}}},
		{"unknown Algorithm", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: time.Second, Algorithm: 3}}}},
		{"negative Algorithm", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: time.Second, Algorithm: -1}}}},
		{"duplicate names", pglimit.Config{Limits: []pglimit.Limit{{Name: "a", Rate: 1, Period: time.Second}, {Name: "a", Rate: 2, Period: time.Minute}}}},
		{"duplicate default names", pglimit.Config{Limits: []pglimit.Limit{ok, {Rate: 5, Period: time.Second, Algorithm: pglimit.FixedWindow}}}},
		{"a name that repeats a default", pglimit.Config{Limits: []pglimit.Limit{ok, {Name: "5-per-1s", Rate: 1, Period: time.Minute}}}},
		{"too many limits", pglimit.Config{Limits: nine}},
		{"a name with a space", pglimit.Config{Limits: []pglimit.Limit{{Name: "per second", Rate: 1, Period: time.Second}}}},
		{"a name with a comma", pglimit.Config{Limits: []pglimit.Limit{{Name: "a,b", Rate: 1, Period: time.Second}}}},
		{"a name with a quote", pglimit.Config{Limits: []pglimit.Limit{{Name: `"a"`, Rate: 1, Period: time.Second}}}},
		{"a name with a semicolon", pglimit.Config{Limits: []pglimit.Limit{{Name: "a;q=1", Rate: 1, Period: time.Second}}}},
		{"a name not ASCII", pglimit.Config{Limits: []pglimit.Limit{{Name: "débit", Rate: 1, Period: time.Second}}}},
		{"a name of 65 bytes", pglimit.Config{Limits: []pglimit.Limit{{Name: strings.Repeat("n", 65), Rate: 1, Period: time.Second}}}},
		{"Range with a burst", pglimit.Config{Strategy: pglimit.Range, Limits: []pglimit.Limit{ok}}},
		{"Range with a window", pglimit.Config{Strategy: pglimit.Range, Limits: []pglimit.Limit{{Rate: 1, Period: time.Second, Algorithm: pglimit.FixedWindow}}}},
		{"Range with two limits", pglimit.Config{Strategy: pglimit.Range, Limits: []pglimit.Limit{{Name: "a", Rate: 1, Period: time.Second}, {Name: "b", Rate: 1, Period: time.Minute}}}},
	} {
		cfg := tt.cfg
		cfg.Schema = schema
		if lim, err := pglimit.New(pool, &cfg); !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("%s: New = %v, %v; want ErrInvalidConfig", tt.name, lim, err)
		}
	}

	// The limits of the bounds are valid.
	all := "!#$%&'*+-.^_`|~09azAZ"
	for _, tt := range []struct {
		name string
		cfg  pglimit.Config
	}{
		{"every token character", pglimit.Config{Limits: []pglimit.Limit{{Name: all, Rate: 1, Period: time.Second}}}},
		{"a name of 64 bytes", pglimit.Config{Limits: []pglimit.Limit{{Name: strings.Repeat("n", 64), Rate: 1, Period: time.Second}}}},
		{"Period 1ms, one per µs", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1000, Period: time.Millisecond}}}},
		{"Period 366 days", pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: 366 * 24 * time.Hour}}}},
		{"8 limits", pglimit.Config{Limits: nine[:pglimit.MaxLimits]}},
		{"Range with a rate and burst 1", pglimit.Config{Strategy: pglimit.Range, Limits: []pglimit.Limit{{Rate: 3, Period: time.Second, Burst: 1}}}},
	} {
		cfg := tt.cfg
		cfg.Schema = schema
		if _, err := pglimit.New(pool, &cfg); err != nil {
			t.Errorf("%s: New = %v, want a limiter", tt.name, err)
		}
	}

	// Costs. GCRA admits 3 at once within 1s (T = 200ms): Reserve fits 3 +
	// 5 units within 1s.
	mixed := []pglimit.Limit{{Name: "g", Rate: 5, Period: time.Second, Burst: 3}, {Name: "f", Rate: 4, Period: time.Second, Algorithm: pglimit.FixedWindow}}
	gcraOnly := []pglimit.Limit{{Name: "g", Rate: 5, Period: time.Second, Burst: 3}}
	window := []pglimit.Limit{{Name: "s", Rate: 2, Period: time.Second, Algorithm: pglimit.SlidingWindow}}
	for _, s := range pglimit.Strategies() {
		newLim := func(limits []pglimit.Limit) pglimit.Limiter {
			cfg := pglimit.Config{Strategy: s, Schema: schema, Limits: limits, Namespace: "bad-" + string(s)}
			if s == pglimit.Range {
				cfg.Limits, cfg.Cooldown = nil, time.Second
			}
			lim, err := pglimit.New(pool, &cfg)
			if err != nil {
				t.Fatal(err)
			}
			return lim
		}
		lim, gcra, win := newLim(mixed), newLim(gcraOnly), newLim(window)
		over := 4 // more than the burst of 3
		if s == pglimit.Range {
			over = 2
		}
		tx := func(n int) (pglimit.Decision, error) {
			var d pglimit.Decision
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var err error
				d, err = lim.AllowTxN(ctx, tx, "k", n)
				if xidAssigned(t, tx) {
					t.Errorf("%s: AllowTxN(%d) assigned a transaction id", s, n)
				}
				return err
			})
			return d, err
		}
		cases := []struct {
			name string
			call func() (pglimit.Decision, error)
			want error
		}{
			{"AllowN(0)", func() (pglimit.Decision, error) { return lim.AllowN(ctx, "k", 0) }, pglimit.ErrInvalidCost},
			{"AllowN(-1)", func() (pglimit.Decision, error) { return lim.AllowN(ctx, "k", -1) }, pglimit.ErrInvalidCost},
			{"AllowN over the burst", func() (pglimit.Decision, error) { return lim.AllowN(ctx, "k", over) }, pglimit.ErrInvalidCost},
			{"AllowN over a window's rate", func() (pglimit.Decision, error) { return win.AllowN(ctx, "k", 3) }, pglimit.ErrInvalidCost},
			{"AllowTxN(0)", func() (pglimit.Decision, error) { return tx(0) }, pglimit.ErrInvalidCost},
			{"AllowTxN over the burst", func() (pglimit.Decision, error) { return tx(over) }, pglimit.ErrInvalidCost},
			{"AllowAtMost(0)", func() (pglimit.Decision, error) { return lim.AllowAtMost(ctx, "k", 0) }, pglimit.ErrInvalidCost},
			{"AllowAtMost(-3)", func() (pglimit.Decision, error) { return lim.AllowAtMost(ctx, "k", -3) }, pglimit.ErrInvalidCost},
			{"Peek(0)", func() (pglimit.Decision, error) { return lim.Peek(ctx, "k", 0) }, pglimit.ErrInvalidCost},
			{"Peek over the burst", func() (pglimit.Decision, error) { return lim.Peek(ctx, "k", over) }, pglimit.ErrInvalidCost},
			{"Reserve on a window limit", func() (pglimit.Decision, error) { return win.Reserve(ctx, "k", 1, time.Second) }, pglimit.ErrUnsupported},
		}
		if s == pglimit.Range {
			cases = append(cases, struct {
				name string
				call func() (pglimit.Decision, error)
				want error
			}{"Reserve on Range", func() (pglimit.Decision, error) { return gcra.Reserve(ctx, "k", 1, time.Second) }, pglimit.ErrUnsupported})
		} else {
			cases = append(cases, []struct {
				name string
				call func() (pglimit.Decision, error)
				want error
			}{
				{"Reserve with a window limit among GCRA", func() (pglimit.Decision, error) { return lim.Reserve(ctx, "k", 1, time.Second) }, pglimit.ErrUnsupported},
				{"Reserve(0)", func() (pglimit.Decision, error) { return gcra.Reserve(ctx, "k", 0, time.Second) }, pglimit.ErrInvalidCost},
				{"Reserve with a negative delay", func() (pglimit.Decision, error) { return gcra.Reserve(ctx, "k", 1, -time.Millisecond) }, pglimit.ErrInvalidCost},
				{"Reserve past the delay", func() (pglimit.Decision, error) { return gcra.Reserve(ctx, "k", 9, time.Second) }, pglimit.ErrInvalidCost},
				{"Reserve past the burst", func() (pglimit.Decision, error) { return gcra.Reserve(ctx, "k", 4, 199*time.Millisecond) }, pglimit.ErrInvalidCost},
			}...)
		}
		for _, c := range cases {
			if d, err := c.call(); !errors.Is(err, c.want) || d.Allowed {
				t.Errorf("%s: %s = %+v, %v; want %v", s, c.name, d, err, c.want)
			}
		}
		// The edges of what Reserve accepts are valid.
		if s != pglimit.Range {
			if d, err := gcra.Reserve(ctx, "edge", 8, time.Second); err != nil || !d.Allowed || d.Delay != time.Second {
				t.Errorf("%s: Reserve(8, 1s) on a fresh key = %+v, %v; want admitted with Delay 1s", s, d, err)
			}
		}
	}
	for _, table := range []string{"pglimit_upsert", "pglimit_nowait", "pglimit_range"} {
		var n int
		q := "SELECT count(*) FROM " + pgx.Identifier{schema, table}.Sanitize() + " WHERE key = 'k'"
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d rows for the key of the bad requests, %v; want none", table, n, err)
		}
	}
}
