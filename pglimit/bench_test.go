package pglimit_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// BenchmarkAllow measures one decision at a time on one connection, with
// allocations, per strategy:
//
//   - floor: SELECT 1 on the same pool, the round trip every decision pays;
//     divide a strategy's ns/op by it for its cost in round trips.
//   - <strategy>/hot: one key in a long cooldown, so every decision after
//     the first is a refusal.
//   - <strategy>/many: a new key each time, so every decision is an
//     admission (a write).
//
// The test server runs with fsync off, so these figures show CPU and round
// trips, not the cost of durable commits; `go run ./loadtest` measures
// that, under concurrency, beside the article's plain-INSERT Range
// (range-naive), which lives with it.
//
//	go test -run '^$' -bench Allow -benchtime 2000x ./pglimit
func BenchmarkAllow(b *testing.B) {
	ctx := context.Background()
	b.Run("floor", func(b *testing.B) {
		pool := pglimittest.Pool(b)
		b.ReportAllocs()
		for b.Loop() {
			var one int
			if err := pool.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
				b.Fatal(err)
			}
		}
	})

	variants := []struct {
		name string
		cfg  pglimit.Config
	}{
		{name: "upsert", cfg: pglimit.Config{Strategy: pglimit.Upsert}},
		{name: "nowait", cfg: pglimit.Config{Strategy: pglimit.NoWait}},
		{name: "range", cfg: pglimit.Config{Strategy: pglimit.Range}},
		// The pre-block answers a hot key in process: no round trip.
		{name: "upsert-preblock", cfg: pglimit.Config{Strategy: pglimit.Upsert, PreBlockSize: 1000}},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			cfg := v.cfg
			cfg.Schema = pglimittest.Schema(b)
			cfg.Cooldown = time.Hour
			lim, err := pglimit.New(pglimittest.Pool(b), &cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.Run("hot", func(b *testing.B) {
				benchAllow(b, lim, func(int) string { return "hot" })
			})
			b.Run("many", func(b *testing.B) {
				prefix := "many-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
				benchAllow(b, lim, func(i int) string { return prefix + strconv.Itoa(i) })
			})
		})
	}
}

func benchAllow(b *testing.B, lim pglimit.Limiter, key func(int) string) {
	ctx := context.Background()
	keys := make([]string, b.N) // built up front, so key formatting is not measured
	for i := range keys {
		keys[i] = key(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := lim.Allow(ctx, keys[i]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOverrides measures what reading a key's own limits costs a
// decision of two limits (a rate and a daily quota) on Upsert: the same
// limiter without Overrides, with Overrides and no row for the key, and
// with a row. Every decision is an admission of a new key, one at a time.
//
//	go test -run '^$' -bench Overrides -benchtime 3000x ./pglimit
func BenchmarkOverrides(b *testing.B) {
	ctx := context.Background()
	limits := []pglimit.Limit{
		{Name: "per-minute", Rate: 100, Period: time.Minute, Burst: 10},
		{Name: "daily", Rate: 1000, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
	}
	for _, v := range []struct {
		name           string
		overrides, row bool
	}{{"plain", false, false}, {"overrides-none", true, false}, {"overrides-row", true, true}} {
		b.Run(v.name, func(b *testing.B) {
			pool := pglimittest.Pool(b)
			cfg := pglimit.Config{Schema: pglimittest.Schema(b), Limits: limits, Overrides: v.overrides}
			lim, err := pglimit.New(pool, &cfg)
			if err != nil {
				b.Fatal(err)
			}
			keys := make([]string, b.N)
			for i := range keys {
				keys[i] = "k" + strconv.Itoa(i)
				if v.row {
					if err := pglimit.SetKeyLimits(ctx, pool, &cfg, keys[i], pglimit.Limit{Name: "per-minute", Rate: 200, Burst: 20}); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if d, err := lim.Allow(ctx, keys[i]); err != nil || !d.Allowed {
					b.Fatalf("%+v, %v", d, err)
				}
			}
		})
	}
}
