package pglimit_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
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
// that, under concurrency, beside the naive plain-INSERT Range
// (range-naive), which lives with it.
//
//	go test -run '^$' -bench Allow -benchtime 2000x ./pglimit
func BenchmarkAllow(b *testing.B) {
	ctx := context.Background()
	b.Run("floor", func(b *testing.B) {
		pool := testdb.Pool(b)
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
			cfg.Schema = testdb.Schema(b)
			cfg.Cooldown = time.Hour
			lim, err := pglimit.New(testdb.Pool(b), &cfg)
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
			pool := testdb.Pool(b)
			cfg := pglimit.Config{Schema: testdb.Schema(b), Namespace: "bench", Limits: limits, Overrides: v.overrides}
			lim, err := pglimit.New(pool, &cfg)
			if err != nil {
				b.Fatal(err)
			}
			keys := make([]string, b.N)
			for i := range keys {
				keys[i] = "k" + strconv.Itoa(i)
				if v.row {
					if err := pglimit.SetKeyLimits(ctx, testdb.Limiter(b, pool, &cfg), keys[i], pglimit.Limit{Name: "per-minute", Rate: 200, Burst: 20}); err != nil {
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

// BenchmarkFeatures measures what the features of docs/limits.md cost,
// one call at a time, each beside what it is weighed against:
//
//   - fixed-window, calendar-day: an admission of a new key under a daily
//     quota, a window from the first request against a calendar day in
//     Europe/Paris, whose bounds the statement computes in the zone.
//
//   - semaphore: Acquire and Release of a slot, two round trips.
//
//   - refund: an admission under a daily quota and its Refund, against
//     the admission alone (fixed-window).
//
//   - fallback: a decision made in process while the database is
//     unreachable (no server listens at the pool's address).
//
//     go test -run '^$' -bench Features -benchtime 3000x ./pglimit
func BenchmarkFeatures(b *testing.B) {
	ctx := context.Background()
	windows := map[string]pglimit.Limit{
		"fixed-window": {Name: "daily", Rate: 1000, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
		"calendar-day": {Name: "daily", Rate: 1000, Algorithm: pglimit.FixedWindow, Calendar: "day", TimeZone: "Europe/Paris"},
	}
	for _, name := range []string{"fixed-window", "calendar-day"} {
		b.Run(name, func(b *testing.B) {
			lim, err := pglimit.New(testdb.Pool(b), &pglimit.Config{Schema: testdb.Schema(b), Limits: []pglimit.Limit{windows[name]}})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if d, err := lim.Allow(ctx, "k"+strconv.Itoa(i)); err != nil || !d.Allowed {
					b.Fatalf("%+v, %v", d, err)
				}
			}
		})
	}
	// A decision with an id (WithID) beside the same without: the id's
	// row is written in the decision's statement.
	for _, withID := range []bool{false, true} {
		b.Run(map[bool]string{false: "id-less", true: "with-id"}[withID], func(b *testing.B) {
			lim, err := pglimit.New(testdb.Pool(b), &pglimit.Config{Schema: testdb.Schema(b), Limits: []pglimit.Limit{{Rate: 1000, Period: time.Second, Burst: 1000}}})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				c := ctx
				if withID {
					c = pglimit.WithID(ctx, "id-"+strconv.Itoa(i))
				}
				if d, err := lim.Allow(c, "k"+strconv.Itoa(i)); err != nil || !d.Allowed {
					b.Fatalf("%+v, %v", d, err)
				}
			}
		})
	}
	b.Run("refund", func(b *testing.B) {
		lim, err := pglimit.New(testdb.Pool(b), &pglimit.Config{Schema: testdb.Schema(b), Limits: []pglimit.Limit{windows["fixed-window"]}})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			d, err := lim.Allow(ctx, "k"+strconv.Itoa(i))
			if err != nil || !d.Allowed {
				b.Fatalf("%+v, %v", d, err)
			}
			if ok, err := lim.Refund(ctx, d, 1); err != nil || !ok {
				b.Fatalf("Refund: %v, %v", ok, err)
			}
		}
	})
	b.Run("semaphore", func(b *testing.B) {
		sem, err := pglimitsem.New(testdb.Pool(b), &pglimitsem.Config{Schema: testdb.Schema(b), Slots: 2})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			s, err := sem.Acquire(ctx, "k"+strconv.Itoa(i%100))
			if err != nil || !s.Acquired {
				b.Fatalf("%+v, %v", s, err)
			}
			if err := sem.Release(ctx, s); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fallback", func(b *testing.B) {
		pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:1/app")
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		lim, err := pglimit.New(pool, &pglimit.Config{Cooldown: time.Hour, Fallback: &pglimit.Fallback{
			Limits: []pglimit.Limit{{Rate: 1000, Period: time.Second, Burst: 1000}}, Retry: time.Hour,
			Logger: slog.New(slog.DiscardHandler),
		}})
		if err != nil {
			b.Fatal(err)
		}
		if d, err := lim.Allow(ctx, "k"); err != nil || !d.Fallback {
			b.Fatalf("the first call: %+v, %v; want the fallback's", d, err)
		}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := lim.Allow(ctx, "k"+strconv.Itoa(i%1000)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAllowAll is a hierarchical decision (AllowAll) of two and three
// levels, an organisation, a user and an API key, against the same levels
// decided by one Allow each, one after the other: what it costs to decide
// them in one statement, all or none. Each is a lone caller; the users and
// keys cycle over 100 whose rows exist after the first round.
//
//	go test -run '^$' -bench AllowAll -benchtime 3000x ./pglimit
func BenchmarkAllowAll(b *testing.B) {
	ctx := context.Background()
	wide := func(ns string) pglimit.Config {
		return pglimit.Config{Namespace: ns, Limits: []pglimit.Limit{{Name: ns, Rate: 1 << 30, Period: 24 * time.Hour, Burst: 1 << 20}}}
	}
	for _, levels := range []int{2, 3} {
		setup := func(b *testing.B) []pglimit.Limiter {
			pool, schema := testdb.Pool(b), testdb.Schema(b)
			var lims []pglimit.Limiter
			for _, ns := range []string{"org", "user", "api-key"}[:levels] {
				cfg := wide(ns)
				cfg.Schema = schema
				lim, err := pglimit.New(pool, &cfg)
				if err != nil {
					b.Fatal(err)
				}
				lims = append(lims, lim)
			}
			return lims
		}
		// One organisation; its users and API keys, 100 of each.
		keys := func(lims []pglimit.Limiter, i int) []pglimit.Charge {
			charges := []pglimit.Charge{{Limiter: lims[0], Key: "acme"}}
			for _, lim := range lims[1:] {
				charges = append(charges, pglimit.Charge{Limiter: lim, Key: "acme/" + strconv.Itoa(i%100)})
			}
			return charges
		}
		b.Run(fmt.Sprintf("levels-%d", levels), func(b *testing.B) {
			lims := setup(b)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if d, err := pglimit.AllowAll(ctx, 1, keys(lims, i)...); err != nil || !d.Allowed {
					b.Fatalf("%+v, %v", d, err)
				}
			}
		})
		b.Run(fmt.Sprintf("calls-%d", levels), func(b *testing.B) {
			lims := setup(b)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				for _, c := range keys(lims, i) {
					if d, err := c.Limiter.Allow(ctx, c.Key); err != nil || !d.Allowed {
						b.Fatalf("%+v, %v", d, err)
					}
				}
			}
		})
	}
}

// BenchmarkSettle is an admission settled at a cost past its estimate,
// into the debt, against the admission alone: what settling adds. Fixed
// windows, whose count and debt are exact.
func BenchmarkSettle(b *testing.B) {
	ctx := context.Background()
	lim := newLimiterOn(b, testdb.Pool(b), pglimit.Config{Schema: testdb.Schema(b),
		Limits: []pglimit.Limit{{Rate: 1 << 30, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow, Debt: 1 << 20}}})
	for _, settle := range []bool{false, true} {
		b.Run(fmt.Sprintf("settle-%t", settle), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				d, err := lim.AllowN(ctx, "k"+strconv.Itoa(i%100), 2)
				if err != nil || !d.Allowed {
					b.Fatalf("%+v, %v", d, err)
				}
				if settle {
					if _, err := pglimit.Settle(ctx, lim, d, 3); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
