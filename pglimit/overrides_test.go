package pglimit_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
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
			if err := pglimit.SetKeyLimits(ctx, a, "pro", pglimit.Limit{Name: "per-minute", Rate: 2, Burst: 3}); err != nil {
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
			if err := pglimit.SetKeyLimits(ctx, a, "pro",
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
			if err := pglimit.SetKeyLimits(ctx, a, "pro"); err != nil {
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
	cfg := pglimit.Config{Schema: testdb.Schema(t), Namespace: "api", Overrides: true,
		Limits: []pglimit.Limit{{Name: "per-hour", Rate: 1, Period: time.Hour, Burst: 1}}}
	pools := []*pgxpool.Pool{testdb.Pool(t), testdb.Pool(t)}
	lims := []pglimit.Limiter{newLimiterOn(t, pools[0], cfg), newLimiterOn(t, pools[1], cfg)}
	if err := pglimit.SetKeyLimits(ctx, lims[0], "k", pglimit.Limit{Name: "per-hour", Burst: 7}); err != nil {
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
	cfg := pglimit.Config{Schema: testdb.Schema(t), Namespace: "api", Overrides: true,
		Limits: []pglimit.Limit{{Name: "per-minute", Rate: 5, Period: time.Minute}, {Name: "daily", Rate: 9, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow}}}
	table := pgx.Identifier{cfg.Schema, "pglimit_overrides"}.Sanitize()
	for _, doc := range []string{
		`{"per-minute": {"rate": 0}}`, `{"per-minute": {"rate": -1}}`, `{"per-minute": {"rate": 1.5}}`,
		`{"per-minute": {"rate": "5"}}`, `{"per-minute": {"rate": 1073741825}}`, `{"per-minute": {"period": 5}}`,
		`{"per-minute": 5}`, `[]`,
	} {
		_, err := pool.Exec(ctx, "INSERT INTO "+table+" (namespace, key, limits) VALUES ($1, 'k', $2)", cfg.Namespace, doc)
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "23514" {
			t.Errorf("INSERT %s: %v, want a check violation", doc, err)
		}
	}
	lim := newLimiterOn(t, pool, cfg)
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
		if err := pglimit.SetKeyLimits(ctx, lim, "k", ls...); !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if err := pglimit.SetKeyLimits(ctx, lim, "", pglimit.Limit{Name: "per-minute", Rate: 5}); !errors.Is(err, pglimit.ErrInvalidKey) {
		t.Errorf("an empty key: %v, want ErrInvalidKey", err)
	}
	plain := cfg
	plain.Overrides = false
	if err := pglimit.SetKeyLimits(ctx, newLimiterOn(t, pool, plain), "k", pglimit.Limit{Name: "per-minute", Rate: 5}); !errors.Is(err, pglimit.ErrInvalidConfig) {
		t.Errorf("a configuration without Overrides: %v, want ErrInvalidConfig", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows after bad input, %v; want none", n, err)
	}
	for name, c := range map[string]pglimit.Config{
		"range":        {Namespace: "api", Strategy: pglimit.Range, Cooldown: time.Minute, Overrides: true},
		"preblock":     {Namespace: "api", Cooldown: time.Minute, PreBlockSize: 10, Overrides: true},
		"no namespace": {Cooldown: time.Minute, Overrides: true},
	} {
		if _, err := pglimit.New(pool, &c); !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("%s with Overrides: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// costCalls are the entry points that take a cost, each deciding n units
// of key on lim; Reserve (with no delay) where every limit is GCRA.
func costCalls(pool *pgxpool.Pool, lim pglimit.Limiter, reserve bool) map[string]func(key string, n int) (pglimit.Decision, error) {
	ctx := context.Background()
	calls := map[string]func(string, int) (pglimit.Decision, error){
		"AllowN": func(key string, n int) (pglimit.Decision, error) { return lim.AllowN(ctx, key, n) },
		"Peek":   func(key string, n int) (pglimit.Decision, error) { return lim.Peek(ctx, key, n) },
		"AllowTxN": func(key string, n int) (d pglimit.Decision, err error) {
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				d, err = lim.AllowTxN(ctx, tx, key, n)
				return err
			})
			return d, err
		},
	}
	if reserve {
		calls["Reserve"] = func(key string, n int) (pglimit.Decision, error) { return lim.Reserve(ctx, key, n, 0) }
	}
	return calls
}

// keyRows counts the limiter table's rows of key in namespace.
func keyRows(t *testing.T, pool *pgxpool.Pool, schema, namespace, key string) int {
	t.Helper()
	var n int
	table := pgx.Identifier{schema, "pglimit_upsert"}.Sanitize()
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table+" WHERE namespace = $1 AND key = $2", namespace, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A burst the table accepts but the limit cannot use, one that takes more
// than 366 days to replenish, is never cut to fit: SetKeyLimits refuses
// it, and written by plain SQL it makes every decision on the key fail
// with ErrInvalidConfig, writing nothing. A burst at the bound is
// honoured to the unit.
func TestOverridesBurstBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	table := pgx.Identifier{schema, "pglimit_overrides"}.Sanitize()
	for _, c := range []struct {
		name   string
		period time.Duration
		bound  int // the largest burst of 1 per period
	}{
		{"daily", 24 * time.Hour, 366},
		{"yearly", 366 * 24 * time.Hour, 1},
	} {
		cfg := pglimit.Config{Schema: schema, Namespace: c.name, Overrides: true,
			Limits: []pglimit.Limit{{Name: "slow", Rate: 1, Period: c.period, Burst: 1}}}
		lim := newLimiterOn(t, pool, cfg)
		if err := pglimit.SetKeyLimits(ctx, lim, "over", pglimit.Limit{Name: "slow", Burst: c.bound + 1}); !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("%s: SetKeyLimits with a burst of %d: %v, want ErrInvalidConfig", c.name, c.bound+1, err)
		}
		for key, burst := range map[string]int{"at": c.bound, "over": c.bound + 1} {
			if _, err := pool.Exec(ctx, "INSERT INTO "+table+" (namespace, key, limits) VALUES ($1, $2, jsonb_build_object('slow', jsonb_build_object('burst', $3::int)))", c.name, key, burst); err != nil {
				t.Fatal(err)
			}
		}
		if d, err := lim.AllowN(ctx, "at", 1); err != nil || !d.Allowed || d.Remaining != c.bound-1 || d.Limit.Burst != c.bound {
			t.Errorf("%s: a burst of %d, at the bound: %+v, %v; want admitted, %d left", c.name, c.bound, d, err, c.bound-1)
		}
		calls := costCalls(pool, lim, true)
		calls["AllowAtMost"] = func(key string, n int) (pglimit.Decision, error) { return lim.AllowAtMost(ctx, key, n) }
		for name, call := range calls {
			if d, err := call("over", 1); !errors.Is(err, pglimit.ErrInvalidConfig) {
				t.Errorf("%s: %s on a key whose burst of %d is past the bound: %+v, %v; want ErrInvalidConfig", c.name, name, c.bound+1, d, err)
			}
		}
		if n := keyRows(t, pool, schema, c.name, "over"); n != 0 {
			t.Errorf("%s: the refused key has %d rows, want none", c.name, n)
		}
	}
}

// A cost that the key's own limits can never admit at once is
// ErrInvalidCost through every entry point, as it is for the limiter's
// limits, not a refusal whose RetryAfter never comes: for every
// algorithm, on a new key and on one with state, writing nothing.
// AllowAtMost grants what the key's limits allow; a cost that only a
// key's raised limits admit is admitted.
func TestOverridesCost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	for _, c := range []struct {
		name                string
		limit, lower, raise pglimit.Limit // capacity 5, 2 and 8
	}{
		// A unit back every 500 ms: none between the first Allow and
		// Peek on a loaded machine (at 10 a second, 100 ms under load gave
		// one back), and Reserve's third unit within its 1 s.
		{"gcra", pglimit.Limit{Rate: 2, Period: time.Second, Burst: 5}, pglimit.Limit{Burst: 2}, pglimit.Limit{Burst: 8}},
		{"fixed", pglimit.Limit{Rate: 5, Period: time.Minute, Algorithm: pglimit.FixedWindow}, pglimit.Limit{Rate: 2}, pglimit.Limit{Rate: 8}},
		{"sliding", pglimit.Limit{Rate: 5, Period: time.Minute, Algorithm: pglimit.SlidingWindow}, pglimit.Limit{Rate: 2}, pglimit.Limit{Rate: 8}},
		{"calendar", pglimit.Limit{Rate: 5, Algorithm: pglimit.FixedWindow, Calendar: "day"}, pglimit.Limit{Rate: 2}, pglimit.Limit{Rate: 8}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.limit.Name, c.lower.Name, c.raise.Name = "l", "l", "l"
			cfg := pglimit.Config{Schema: schema, Namespace: c.name, Overrides: true, Limits: []pglimit.Limit{c.limit}}
			lim := newLimiterOn(t, pool, cfg)
			for key, l := range map[string]pglimit.Limit{"low": c.lower, "new": c.lower, "most": c.lower, "high": c.raise} {
				if err := pglimit.SetKeyLimits(ctx, lim, key, l); err != nil {
					t.Fatal(err)
				}
			}
			calls := costCalls(pool, lim, c.limit.Algorithm == pglimit.GCRA)
			if d, err := lim.Allow(ctx, "low"); err != nil || !d.Allowed {
				t.Fatalf("Allow: %+v, %v", d, err)
			}
			for _, key := range []string{"new", "low"} {
				for name, call := range calls {
					if d, err := call(key, 3); !errors.Is(err, pglimit.ErrInvalidCost) {
						t.Errorf("%s(3) on key %q of capacity 2: %+v, %v; want ErrInvalidCost", name, key, d, err)
					}
				}
			}
			if n := keyRows(t, pool, schema, c.name, "new"); n != 0 {
				t.Errorf("the new key has %d rows after costs it could not admit, want none", n)
			}
			if d, err := lim.Peek(ctx, "low", 1); err != nil || !d.Allowed || d.Remaining != 0 {
				t.Errorf("Peek after the refused costs: %+v, %v; want one unit left, as the first Allow left it", d, err)
			}
			if d, err := lim.AllowAtMost(ctx, "most", 3); err != nil || !d.Allowed || d.Granted != 2 {
				t.Errorf("AllowAtMost(3) on a key of capacity 2: %+v, %v; want 2 granted", d, err)
			}
			if d, err := lim.AllowN(ctx, "high", 7); err != nil || !d.Allowed || d.Remaining != 1 {
				t.Errorf("AllowN(7) on a key raised to 8: %+v, %v; want admitted, one left", d, err)
			}
			if c.limit.Algorithm == pglimit.GCRA {
				// 3 units at 100 ms each fit a burst of 2 within a second.
				if d, err := lim.Reserve(ctx, "new", 3, time.Second); err != nil || !d.Allowed || d.Delay <= 0 {
					t.Errorf("Reserve(3, 1s) on a key of burst 2: %+v, %v; want admitted with a delay", d, err)
				}
			}
		})
	}
}

// A row naming a limit the limiter does not have (a typo), or a value its
// limit cannot take (a burst on a window, more than one per microsecond),
// is refused by SetKeyLimits; written by plain SQL, it is never ignored:
// every decision on the key fails with ErrInvalidConfig naming it, and
// writes nothing. Whole numbers written as 5.0, which the table accepts,
// are used.
func TestOverridesUnusableRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	cfg := pglimit.Config{Schema: testdb.Schema(t), Namespace: "api", Overrides: true, Limits: []pglimit.Limit{
		{Name: "per-minute", Rate: 5, Period: time.Minute, Burst: 5},
		{Name: "daily", Rate: 9, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
	}}
	lim := newLimiterOn(t, pool, cfg)
	table := pgx.Identifier{cfg.Schema, "pglimit_overrides"}.Sanitize()
	insert := func(key, doc string) {
		t.Helper()
		if _, err := pool.Exec(ctx, "INSERT INTO "+table+" (namespace, key, limits) VALUES ($1, $2, $3)", cfg.Namespace, key, doc); err != nil {
			t.Fatal(err)
		}
	}
	for key, c := range map[string]struct{ doc, names string }{
		"typo":        {`{"per-minute": {"rate": 10}, "dialy": {"rate": 20}}`, "dialy"},
		"window":      {`{"daily": {"burst": 3}}`, "daily"},
		"per-µs":      {`{"per-minute": {"rate": 60000001}}`, "per-minute"},
		"two-unknown": {`{"hourly": {"rate": 1}, "weekly": {"rate": 2}}`, `"hourly" "weekly"`},
	} {
		insert(key, c.doc)
		calls := costCalls(pool, lim, false)
		calls["AllowAtMost"] = func(key string, n int) (pglimit.Decision, error) { return lim.AllowAtMost(ctx, key, n) }
		for name, call := range calls {
			d, err := call(key, 1)
			if !errors.Is(err, pglimit.ErrInvalidConfig) || !strings.Contains(err.Error(), c.names) {
				t.Errorf("%s on a key whose row is %s: %+v, %v; want ErrInvalidConfig naming %s", name, c.doc, d, err, c.names)
			}
		}
		if n := keyRows(t, pool, cfg.Schema, cfg.Namespace, key); n != 0 {
			t.Errorf("key %q has %d rows after its decisions failed, want none", key, n)
		}
	}
	insert("decimal", `{"per-minute": {"rate": 6.0, "burst": 2.0}, "daily": {"rate": 4.00}}`)
	if d, err := lim.AllowN(ctx, "decimal", 2); err != nil || !d.Allowed || d.Remaining != 0 || d.Limit.Burst != 2 {
		t.Errorf("a row of 6.0, 2.0 and 4.00: %+v, %v; want a burst of 2 used up", d, err)
	}
}

// SetKeyLimits on a server that cannot write is ErrReadOnly, and it waits
// no longer than Config.Timeout for a row another transaction holds
// (ErrTimeout). Neither writes.
func TestSetKeyLimitsServerErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	cfg := pglimit.Config{Schema: testdb.Schema(t), Namespace: "api", Overrides: true, Timeout: 200 * time.Millisecond,
		Limits: []pglimit.Limit{{Name: "per-minute", Rate: 5, Period: time.Minute}}}

	pcfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	readOnly, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer readOnly.Close()
	onReadOnly := newLimiterOn(t, readOnly, cfg)
	if err := pglimit.SetKeyLimits(ctx, onReadOnly, "k", pglimit.Limit{Name: "per-minute", Rate: 9}); !errors.Is(err, pglimit.ErrReadOnly) {
		t.Errorf("SetKeyLimits on a read-only server: %v, want ErrReadOnly", err)
	}
	if err := pglimit.SetKeyLimits(ctx, onReadOnly, "k"); !errors.Is(err, pglimit.ErrReadOnly) {
		t.Errorf("SetKeyLimits removing limits on a read-only server: %v, want ErrReadOnly", err)
	}

	// An uncommitted row of the key: SetKeyLimits' INSERT waits for it.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	table := pgx.Identifier{cfg.Schema, "pglimit_overrides"}.Sanitize()
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+` (namespace, key, limits) VALUES ($1, 'k', '{}')`, cfg.Namespace); err != nil {
		t.Fatal(err)
	}
	ctx5, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	err = pglimit.SetKeyLimits(ctx5, newLimiterOn(t, pool, cfg), "k", pglimit.Limit{Name: "per-minute", Rate: 9})
	if took := time.Since(start); !errors.Is(err, pglimit.ErrTimeout) || took > time.Second {
		t.Errorf("SetKeyLimits behind a held row: %v after %s; want ErrTimeout after the 200ms Timeout", err, took.Round(time.Millisecond))
	}
}
