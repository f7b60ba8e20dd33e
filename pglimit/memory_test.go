package pglimit_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// The memory bound: decisions on many distinct keys, each called by four
// callers at once (so that calls merge, a busy key leases, flights
// coalesce and the pre-block remembers), leave nothing per key once the
// process has been idle for twice leaseIdle. 100,000 keys in the full
// tier, 10,000 in the quick one.
func TestMemoryIdleKeys(t *testing.T) {
	keys := 100_000
	if testing.Short() {
		keys = 10_000
	}
	pool := bigPool(t, 16)
	schema := testdb.Schema(t)
	var lims []pglimit.Limiter
	for _, cfg := range []pglimit.Config{
		{Namespace: "leases", Limits: []pglimit.Limit{{Rate: 10000, Period: time.Second, Burst: 100}}},
		{Namespace: "merge", Cooldown: time.Hour, PreBlockSize: 100},
		{Namespace: "flights", Strategy: pglimit.Range, Cooldown: time.Hour},
		{Namespace: "two limits", Limits: []pglimit.Limit{
			{Name: "rate", Rate: 5, Period: time.Minute, Burst: 3},
			{Name: "daily", Algorithm: pglimit.FixedWindow, Rate: 1000, Period: 24 * time.Hour},
		}, Fallback: &pglimit.Fallback{Limits: []pglimit.Limit{{Rate: 1, Period: time.Second}}}},
	} {
		cfg.Schema = schema
		lim, err := pglimit.New(pool, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		lims = append(lims, lim)
	}
	// A warm-up, so that what is measured is per key and not the pools' and
	// limiters' first allocations.
	decideAll(t, lims, "warm", 200)
	before := testdb.LiveHeap()
	start := time.Now()
	decideAll(t, lims, "k", keys)
	busy := testdb.LiveHeap()
	time.Sleep(2*time.Second + 100*time.Millisecond)
	after := testdb.LiveHeap()
	perKey := func(h uint64) float64 { return (float64(h) - float64(before)) / float64(keys) }
	t.Logf("%d keys × %d limiters in %s: live heap %.0f B per key while busy, %.1f B per key idle",
		keys, len(lims), time.Since(start).Round(time.Millisecond), perKey(busy), perKey(after))
	if bound := float64(testdb.IdleBytesPerKey*keys + testdb.IdleNoise); float64(after)-float64(before) > bound {
		t.Errorf("idle, the limiters keep %.1f B per key, %.0f B in all; the bound is %d B per key and %d B", perKey(after), float64(after)-float64(before), testdb.IdleBytesPerKey, testdb.IdleNoise)
	}
	runtime.KeepAlive(lims)
}

// decideAll makes four concurrent calls on each of n keys, on every
// limiter, 64 keys at a time.
func decideAll(t *testing.T, lims []pglimit.Limiter, prefix string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range n {
		key := fmt.Sprintf("%s-%d", prefix, i)
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			var inner sync.WaitGroup
			for _, lim := range lims {
				for range 4 {
					inner.Go(func() {
						if _, err := lim.Allow(t.Context(), key); err != nil {
							t.Error(err)
						}
					})
				}
			}
			inner.Wait()
		})
	}
	wg.Wait()
}

// The memory bound of AllowAll and Settle: a hierarchical decision on two
// levels (an organisation's key and a user's) of each of many distinct
// pairs of keys, then a Settle of the user's level at a cost above or
// below its estimate, leave nothing per key once the process has been
// idle for twice leaseIdle: AllowAll keeps only its statements, by set of
// limiters, and a decision's settle state is the caller's Decision.
// 100,000 pairs in the full tier, 10,000 in the quick one.
func TestMemoryIdleAllowAllSettle(t *testing.T) {
	keys := 100_000
	if testing.Short() {
		keys = 10_000
	}
	pool := bigPool(t, 16)
	schema := testdb.Schema(t)
	newLim := func(ns string, rate int) pglimit.Limiter {
		lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: ns,
			Limits: []pglimit.Limit{{Rate: rate, Period: time.Second, Burst: 10, Debt: 10}}})
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}
	org, user := newLim("org", 100), newLim("user", 10)
	run := func(prefix string, n int) {
		var wg sync.WaitGroup
		window := make(chan struct{}, 64)
		for i := range n {
			window <- struct{}{}
			wg.Go(func() {
				defer func() { <-window }()
				d, err := pglimit.AllowAll(t.Context(), 2,
					pglimit.Charge{Limiter: org, Key: fmt.Sprintf("%s-org-%d", prefix, i)},
					pglimit.Charge{Limiter: user, Key: fmt.Sprintf("%s-user-%d", prefix, i)})
				if err != nil || !d.Allowed {
					t.Errorf("AllowAll: %+v, %v", d, err)
					return
				}
				// Half the settles give units back, half charge more.
				if _, err := pglimit.Settle(t.Context(), user, d.Levels[1], 1+2*(i%2)); err != nil {
					t.Errorf("Settle: %v", err)
				}
			})
		}
		wg.Wait()
	}
	run("warm", 200)
	before := testdb.LiveHeap()
	start := time.Now()
	run("k", keys)
	busy := testdb.LiveHeap()
	time.Sleep(2*time.Second + 100*time.Millisecond)
	after := testdb.LiveHeap()
	perKey := func(h uint64) float64 { return (float64(h) - float64(before)) / float64(keys) }
	t.Logf("%d pairs of keys decided and settled in %s: live heap %.1f B per pair at the end, %.1f B per pair idle",
		keys, time.Since(start).Round(time.Millisecond), perKey(busy), perKey(after))
	if bound := float64(testdb.IdleBytesPerKey*keys + testdb.IdleNoise); float64(after)-float64(before) > bound {
		t.Errorf("idle, AllowAll and Settle keep %.1f B per pair of keys, %.0f B in all; the bound is %d B per key and %d B", perKey(after), float64(after)-float64(before), testdb.IdleBytesPerKey, testdb.IdleNoise)
	}
	runtime.KeepAlive([]pglimit.Limiter{org, user})
}
