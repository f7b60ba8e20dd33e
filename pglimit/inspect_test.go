package pglimit_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// inspectLimits are two limits a key can stand differently under: a
// burst of 3 that refills one every 20 s, and 5 an hour.
var inspectLimits = []pglimit.Limit{
	{Name: "per-minute", Rate: 3, Period: time.Minute, Burst: 3},
	{Name: "hourly", Rate: 5, Period: time.Hour, Algorithm: pglimit.FixedWindow},
}

// Inspect reads each limit's standing as the decisions left it, agrees
// with Peek on the refusal, and consumes nothing.
func TestInspect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			pool := testdb.Pool(t)
			cfg := pglimit.Config{Schema: schema, Namespace: "inspect-" + string(s), Strategy: s, Limits: inspectLimits}
			lim := newLimiterOn(t, pool, cfg)

			fresh, err := pglimit.Inspect(ctx, lim, "new")
			if err != nil {
				t.Fatal(err)
			}
			if len(fresh.Limits) != 2 || fresh.Limits[0].Remaining != 3 || fresh.Limits[1].Remaining != 5 || fresh.Refused() || fresh.Own != nil ||
				!fresh.Limits[1].WindowEnd.IsZero() {
				t.Fatalf("a key with no row: %+v, want full burst and quota, and no window until its first request", fresh)
			}

			for range 3 {
				if d, err := lim.Allow(ctx, "bob"); err != nil || !d.Allowed {
					t.Fatalf("Allow: %+v, %v", d, err)
				}
			}
			st, err := pglimit.Inspect(ctx, lim, "bob")
			if err != nil {
				t.Fatal(err)
			}
			minute, hour := st.Limits[0], st.Limits[1]
			if minute.Limit.Name != "per-minute" || minute.Remaining != 0 || minute.RetryAfter <= 19*time.Second || minute.RetryAfter > 20*time.Second ||
				minute.ResetAfter <= 59*time.Second || minute.ResetAfter > time.Minute || !minute.WindowEnd.IsZero() {
				t.Errorf("per-minute after a burst of 3: %+v; want 0 left, one back within 20 s, all within 60 s", minute)
			}
			if hour.Remaining != 2 || hour.RetryAfter != 0 || hour.WindowEnd.Sub(st.At) <= 59*time.Minute || hour.WindowEnd.Sub(st.At) > time.Hour {
				t.Errorf("hourly after 3: %+v; want 2 left in a window ending within the hour", hour)
			}
			if !st.Refused() {
				t.Error("Refused() = false for a key at its burst")
			}
			peek, err := lim.Peek(ctx, "bob", 1)
			if err != nil {
				t.Fatal(err)
			}
			if peek.Allowed || peek.Limit.Name != "per-minute" || (peek.RetryAfter-minute.RetryAfter).Abs() > time.Second {
				t.Errorf("Peek %+v disagrees with Inspect's per-minute %+v", peek, minute)
			}
			again, err := pglimit.Inspect(ctx, lim, "bob")
			if err != nil || again.Limits[1].Remaining != 2 {
				t.Errorf("Inspect again: %+v, %v; Inspect consumed units", again, err)
			}
		})
	}
}

// Inspect and LimitedKeys refuse what they cannot read, with typed errors.
func TestInspectBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	cfg := pglimit.Config{Schema: testdb.Schema(t), Namespace: "bad", Limits: inspectLimits}
	lim := newLimiterOn(t, pool, cfg)
	if _, err := pglimit.Inspect(ctx, lim, ""); !errors.Is(err, pglimit.ErrInvalidKey) {
		t.Errorf("Inspect of an empty key: %v, want ErrInvalidKey", err)
	}
	if _, err := pglimit.Inspect(ctx, lim, "a\xffb"); !errors.Is(err, pglimit.ErrInvalidKey) {
		t.Errorf("Inspect of invalid UTF-8: %v, want ErrInvalidKey", err)
	}
	rng := pglimit.Config{Schema: cfg.Schema, Strategy: pglimit.Range, Cooldown: time.Second}
	if _, err := pglimit.Inspect(ctx, testdb.Limiter(t, pool, &rng), "k"); !errors.Is(err, pglimit.ErrUnsupported) {
		t.Errorf("Inspect on Range: %v, want ErrUnsupported", err)
	}
	for _, n := range []int{0, -1, 4} { // the smallest capacity is 3
		if _, err := pglimit.LimitedKeys(ctx, lim, n, "", 10); !errors.Is(err, pglimit.ErrInvalidCost) {
			t.Errorf("LimitedKeys with n = %d: %v, want ErrInvalidCost", n, err)
		}
	}
	for _, max := range []int{0, 1001} {
		if _, err := pglimit.LimitedKeys(ctx, lim, 1, "", max); !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("LimitedKeys with max = %d: %v, want ErrInvalidConfig", max, err)
		}
	}
	if _, err := pglimit.LimitedKeys(ctx, lim, 1, "\x00", 10); !errors.Is(err, pglimit.ErrInvalidKey) {
		t.Errorf("LimitedKeys after a NUL: %v, want ErrInvalidKey", err)
	}
}

// LimitedKeys lists exactly the keys that would refuse n units, in key
// order, page by page, each key by its own limits.
func TestLimitedKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	cfg := pglimit.Config{Schema: testdb.Schema(t), Namespace: "limited", Overrides: true, Limits: inspectLimits}
	lim := newLimiterOn(t, pool, cfg)
	// pro has a burst of 10 of its own, so 3 leave it well short of it.
	if err := pglimit.SetKeyLimits(ctx, lim, "pro", pglimit.Limit{Name: "per-minute", Burst: 10}); err != nil {
		t.Fatal(err)
	}
	use := map[string]int{"a": 3, "b": 2, "c": 3, "d": 0, "pro": 3, "e": 1}
	for key, n := range use {
		for range n {
			if d, err := lim.Allow(ctx, key); err != nil || !d.Allowed {
				t.Fatalf("Allow(%s): %+v, %v", key, d, err)
			}
		}
	}
	keysOf := func(n int, after string, max int) []string {
		t.Helper()
		states, err := pglimit.LimitedKeys(ctx, lim, n, after, max)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, s := range states {
			keys = append(keys, s.Key)
			if s.Key == "pro" && (s.Own == nil || s.Limits[0].Limit.Burst != 10) {
				t.Errorf("pro's state: %+v, want its own burst of 10", s)
			}
		}
		return keys
	}
	if got := keysOf(1, "", 100); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("keys at their limit: %q, want a and c", got)
	}
	if got := keysOf(2, "", 100); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("keys with fewer than 2 left: %q, want a, b and c", got)
	}
	if got := keysOf(1, "a", 1); !slices.Equal(got, []string{"c"}) {
		t.Errorf("the page after a, of one: %q, want c", got)
	}
	if got := keysOf(1, "c", 100); len(got) != 0 {
		t.Errorf("the page after c: %q, want none", got)
	}
}

// A key's own limits for a while count until they lapse, on the database
// clock, to the microsecond, and then the key is back on the limiter's,
// keeping what it used.
func TestSetKeyLimitsFor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := pglimittest.NewClock(t)
	pool := clock.Pool(t)
	cfg := pglimit.Config{Schema: testdb.Schema(t), Namespace: "lapse", Overrides: true, Limits: inspectLimits}
	lim := newLimiterOn(t, pool, cfg)

	for _, ttl := range []time.Duration{0, -time.Second, 367 * 24 * time.Hour} {
		err := pglimit.SetKeyLimitsFor(ctx, lim, "bob", ttl, pglimit.Limit{Name: "per-minute", Burst: 5})
		if !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("SetKeyLimitsFor with ttl %s: %v, want ErrInvalidConfig", ttl, err)
		}
	}
	if own, err := pglimit.ListKeyLimits(ctx, lim, "", 10); err != nil || len(own) != 0 {
		t.Fatalf("after refused calls: %+v, %v; want nothing written", own, err)
	}

	const ttl = time.Hour
	if err := pglimit.SetKeyLimitsFor(ctx, lim, "bob", ttl, pglimit.Limit{Name: "per-minute", Burst: 4}); err != nil {
		t.Fatal(err)
	}
	own, err := pglimit.ListKeyLimits(ctx, lim, "", 10)
	if err != nil || len(own) != 1 || own[0].Key != "bob" || !slices.Equal(own[0].Limits, []pglimit.Limit{{Name: "per-minute", Burst: 4}}) ||
		own[0].Expires.Sub(own[0].Updated) != ttl {
		t.Fatalf("ListKeyLimits: %+v, %v; want bob's burst of 4 for %s", own, err, ttl)
	}
	if got := allowUntilRefused(t, lim, "bob", 10); got != 4 {
		t.Fatalf("with its own burst: %d admitted, want 4", got)
	}
	st, err := pglimit.Inspect(ctx, lim, "bob")
	if err != nil || st.Own == nil || !st.Own.Expires.Equal(own[0].Expires) {
		t.Fatalf("Inspect while it counts: %+v, %v", st, err)
	}

	// An hour on, the key is back on the limiter's burst of 3 to the
	// microsecond (its minute and its hour have renewed meanwhile).
	clock.Advance(ttl - time.Microsecond)
	if st, err = pglimit.Inspect(ctx, lim, "bob"); err != nil || st.Own == nil || st.Limits[0].Limit.Burst != 4 {
		t.Fatalf("Inspect 1µs before they lapse: %+v, %v; want the burst of 4 still", st, err)
	}
	clock.Advance(time.Microsecond)
	st, err = pglimit.Inspect(ctx, lim, "bob")
	if err != nil || st.Own != nil || st.Limits[0].Limit.Burst != 3 || st.Limits[0].Remaining != 3 {
		t.Fatalf("Inspect once they lapsed: %+v, %v; want the limiter's burst of 3, all of it left", st, err)
	}
	if got := allowUntilRefused(t, lim, "bob", 10); got != 3 {
		t.Errorf("once they lapsed: %d admitted, want the limiter's burst of 3", got)
	}
	if own, err := pglimit.ListKeyLimits(ctx, lim, "", 10); err != nil || len(own) != 0 {
		t.Errorf("ListKeyLimits once they lapsed: %+v, %v; want none", own, err)
	}
}

// A Table or Schema that names no table makes Inspect, LimitedKeys,
// ListKeyLimits and SetKeyLimits fail with ErrInvalidConfig naming it, as
// a decision does, not with a bare SQLSTATE 42P01 that looks like an
// outage. ListKeyLimits and SetKeyLimits read the schema's table of own
// limits, not Table: only a misspelt schema fails them.
func TestInspectMisspeltTableIsInvalidConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	for _, tc := range []struct {
		name   string
		cfg    pglimit.Config
		names  string
		schema bool // the misspelling is the schema's
	}{
		{"misspelt table", pglimit.Config{Schema: schema, Table: "pglimit_upsrt", Namespace: "ns", Overrides: true, Limits: inspectLimits}, "pglimit_upsrt", false},
		{"misspelt schema", pglimit.Config{Schema: schema + "x", Namespace: "ns", Overrides: true, Limits: inspectLimits}, schema + "x", true},
		{"Upsert on a Range table", pglimit.Config{Schema: schema, Table: "pglimit_range", Namespace: "ns", Limits: inspectLimits}, "pglimit_range", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, pglimit.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.names) {
					t.Errorf("%s: %v; want ErrInvalidConfig naming %s", what, err, tc.names)
				}
			}
			lim := newLimiterOn(t, pool, tc.cfg)
			_, err := pglimit.Inspect(ctx, lim, "k")
			want("Inspect", err)
			_, err = pglimit.LimitedKeys(ctx, lim, 1, "", 10)
			want("LimitedKeys", err)
			if tc.schema {
				_, err = pglimit.ListKeyLimits(ctx, lim, "", 10)
				want("ListKeyLimits", err)
				want("SetKeyLimits", pglimit.SetKeyLimits(ctx, lim, "k", pglimit.Limit{Name: "per-minute", Burst: 9}))
			}
		})
	}
}
