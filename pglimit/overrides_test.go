package pglimit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// allowUntilRefused calls Allow on key until a refusal, and returns how
// many were admitted (at most max).
func allowUntilRefused(t *testing.T, lim pglimit.Limiter, key string, max int) int {
	t.Helper()
	for i := range max + 1 {
		d, err := lim.Allow(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			return i
		}
	}
	return max + 1
}

// Keys get their own limits, set by the API or by plain SQL, and every
// instance's next decision uses them; a key keeps what it has consumed
// when its limits change.
func TestOverrides(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			cfg := pglimit.Config{Schema: schema, Namespace: string(s), Strategy: s, Overrides: true, Limits: []pglimit.Limit{
				{Name: "per-minute", Rate: 2, Period: time.Minute, Burst: 2},
				{Name: "daily", Rate: 5, Algorithm: pglimit.FixedWindow, Calendar: "day"},
			}}
			pool := testdb.Pool(t)
			a, b := newLimiterOn(t, pool, cfg), newLimiterOn(t, testdb.Pool(t), cfg)

			if got := allowUntilRefused(t, a, "free", 10); got != 2 {
				t.Fatalf("a key without an override: %d admitted, want the limiter's burst, 2", got)
			}
			if err := pglimit.SetKeyLimits(ctx, pool, &cfg, "pro", pglimit.Limit{Name: "per-minute", Rate: 2, Burst: 3}); err != nil {
				t.Fatal(err)
			}
			d, err := b.Allow(ctx, "pro")
			if err != nil || !d.Allowed || d.Limit.Name != "per-minute" || d.Limit.Burst != 3 || d.Remaining != 2 {
				t.Fatalf("the other instance's first decision on an overridden key: %+v, %v; want its burst of 3", d, err)
			}
			if got := allowUntilRefused(t, a, "pro", 10); got != 2 {
				t.Fatalf("the rest of pro's burst: %d admitted, want 2", got)
			}

			// Raised at runtime by plain SQL: the burst grows by 2, and
			// what was booked stays booked, so exactly 2 more pass.
			table := pgx.Identifier{schema, "pglimit_overrides"}.Sanitize()
			if _, err := pool.Exec(ctx, "UPDATE "+table+` SET limits = '{"per-minute": {"burst": 5}}' WHERE namespace = $1 AND key = 'pro'`, string(s)); err != nil {
				t.Fatal(err)
			}
			if got := allowUntilRefused(t, b, "pro", 10); got != 2 {
				t.Fatalf("after raising the burst from 3 to 5: %d admitted, want 2 (the first 3 stay counted)", got)
			}

			// The daily window's count carries over too: pro has used 5
			// of a daily quota raised to 6 (and the per-minute burst
			// grows to 8, of which 5 are booked).
			if err := pglimit.SetKeyLimits(ctx, pool, &cfg, "pro",
				pglimit.Limit{Name: "per-minute", Rate: 2, Burst: 8}, pglimit.Limit{Name: "daily", Rate: 6}); err != nil {
				t.Fatal(err)
			}
			d, err = a.Allow(ctx, "pro")
			if err != nil || !d.Allowed || d.Remaining != 0 || d.Limit.Name != "daily" {
				t.Fatalf("the sixth of a daily 6: %+v, %v; want admitted, none left", d, err)
			}
			if d, err := b.Peek(ctx, "pro", 1); err != nil || d.Allowed || d.Limit.Rate != 6 {
				t.Fatalf("Peek after the quota: %+v, %v; want refused by the daily 6", d, err)
			}

			// Taken away: the limiter's own limits again, and the daily 5
			// is long used.
			if err := pglimit.SetKeyLimits(ctx, pool, &cfg, "pro"); err != nil {
				t.Fatal(err)
			}
			if d, err := b.Allow(ctx, "pro"); err != nil || d.Allowed || d.Limit.Rate > 5 {
				t.Fatalf("after the override is removed: %+v, %v; want refused under the limiter's limits", d, err)
			}
		})
	}
}

// Two instances race on an overridden key: exactly its burst is admitted,
// in callers' transactions too.
func TestOverridesUnderContention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := pglimit.Config{Schema: testdb.Schema(t), Overrides: true,
		Limits: []pglimit.Limit{{Name: "per-hour", Rate: 1, Period: time.Hour, Burst: 1}}}
	pools := []*pgxpool.Pool{testdb.Pool(t), testdb.Pool(t)}
	lims := []pglimit.Limiter{newLimiterOn(t, pools[0], cfg), newLimiterOn(t, pools[1], cfg)}
	if err := pglimit.SetKeyLimits(ctx, pools[0], &cfg, "k", pglimit.Limit{Name: "per-hour", Burst: 7}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	admitted := 0
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			var d pglimit.Decision
			var err error
			if i%3 == 0 {
				err = pgx.BeginFunc(ctx, pools[i%2], func(tx pgx.Tx) error {
					d, err = lims[i%2].AllowTx(ctx, tx, "k")
					return err
				})
			} else {
				d, err = lims[i%2].Allow(ctx, "k")
			}
			if err != nil && !errors.Is(err, pglimit.ErrTimeout) {
				t.Error(err)
			}
			if d.Allowed {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if admitted != 7 {
		t.Fatalf("30 calls from two instances on a key with a burst of 7: %d admitted", admitted)
	}
}

// What a decision could not use is refused: by the table for plain SQL,
// by SetKeyLimits with a typed error; neither writes.
func TestOverridesBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	cfg := pglimit.Config{Schema: testdb.Schema(t), Overrides: true,
		Limits: []pglimit.Limit{{Name: "per-minute", Rate: 5, Period: time.Minute}, {Name: "daily", Rate: 9, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow}}}
	table := pgx.Identifier{cfg.Schema, "pglimit_overrides"}.Sanitize()
	for _, doc := range []string{
		`{"per-minute": {"rate": 0}}`, `{"per-minute": {"rate": -1}}`, `{"per-minute": {"rate": 1.5}}`,
		`{"per-minute": {"rate": "5"}}`, `{"per-minute": {"rate": 1073741825}}`, `{"per-minute": {"period": 5}}`,
		`{"per-minute": 5}`, `[]`,
	} {
		_, err := pool.Exec(ctx, "INSERT INTO "+table+" (namespace, key, limits) VALUES ('default', 'k', $1)", doc)
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "23514" {
			t.Errorf("INSERT %s: %v, want a check violation", doc, err)
		}
	}
	for name, ls := range map[string][]pglimit.Limit{
		"unknown limit":    {{Name: "hourly", Rate: 5}},
		"a period":         {{Name: "per-minute", Rate: 5, Period: time.Hour}},
		"negative":         {{Name: "per-minute", Rate: -5}},
		"nothing to set":   {{Name: "per-minute"}},
		"burst of window":  {{Name: "daily", Burst: 5}},
		"twice":            {{Name: "per-minute", Rate: 5}, {Name: "per-minute", Rate: 6}},
		"too fast":         {{Name: "per-minute", Rate: 1 << 30}},
		"a calendar":       {{Name: "daily", Rate: 5, Calendar: "day"}},
		"algorithm change": {{Name: "per-minute", Rate: 5, Algorithm: pglimit.SlidingWindow}},
	} {
		if err := pglimit.SetKeyLimits(ctx, pool, &cfg, "k", ls...); !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if err := pglimit.SetKeyLimits(ctx, pool, &cfg, "", pglimit.Limit{Name: "per-minute", Rate: 5}); !errors.Is(err, pglimit.ErrInvalidKey) {
		t.Errorf("an empty key: %v, want ErrInvalidKey", err)
	}
	plain := cfg
	plain.Overrides = false
	if err := pglimit.SetKeyLimits(ctx, pool, &plain, "k", pglimit.Limit{Name: "per-minute", Rate: 5}); !errors.Is(err, pglimit.ErrInvalidConfig) {
		t.Errorf("a configuration without Overrides: %v, want ErrInvalidConfig", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows after bad input, %v; want none", n, err)
	}
	for name, c := range map[string]pglimit.Config{
		"range":    {Strategy: pglimit.Range, Cooldown: time.Minute, Overrides: true},
		"preblock": {Cooldown: time.Minute, PreBlockSize: 10, Overrides: true},
	} {
		if _, err := pglimit.New(pool, &c); !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("%s with Overrides: %v, want ErrInvalidConfig", name, err)
		}
	}
}
