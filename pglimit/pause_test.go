package pglimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// A paused key is refused until the pause ends, to the microsecond on a
// test clock, from every instance; then one unit passes and the burst
// refills at the rate. A shorter pause does not shorten a longer one.
func TestPause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			clock := pglimittest.NewClock(t)
			cfg := pglimit.Config{Schema: testdb.Schema(t), Strategy: s, Limits: []pglimit.Limit{{Rate: 10, Period: time.Minute, Burst: 5}}}
			a, b := newLimiterOn(t, clock.Pool(t), cfg), newLimiterOn(t, clock.Pool(t), cfg)
			allowed := func(lim pglimit.Limiter) bool {
				t.Helper()
				d, err := lim.Allow(ctx, "api.example.com")
				if err != nil {
					t.Fatal(err)
				}
				return d.Allowed
			}
			if !allowed(a) {
				t.Fatal("the first request, before any pause, was refused")
			}
			if err := pglimit.Pause(ctx, a, "api.example.com", 30*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := pglimit.Pause(ctx, b, "api.example.com", 10*time.Second); err != nil {
				t.Fatal(err)
			}
			clock.Advance(30*time.Second - time.Microsecond)
			if allowed(b) || allowed(a) {
				t.Fatal("a request 1 µs before the pause of 30 s ended was admitted")
			}
			clock.Advance(time.Microsecond)
			if !allowed(b) {
				t.Fatal("the first request when the pause ended was refused")
			}
			if allowed(a) {
				t.Fatal("a second request at once after the pause was admitted: the burst refills at the rate")
			}
			clock.Advance(6 * time.Second) // one emission interval
			if !allowed(a) {
				t.Fatal("a request one emission interval after the first was refused")
			}
		})
	}
}

// Pause refuses what it cannot do, with typed errors, and writes nothing.
func TestPauseBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	gcra := newLimiterOn(t, pool, pglimit.Config{Schema: schema, Limits: []pglimit.Limit{{Rate: 10, Period: time.Minute}}})
	window := newLimiterOn(t, pool, pglimit.Config{Schema: schema, Namespace: "w", Limits: []pglimit.Limit{{Rate: 10, Period: time.Minute, Algorithm: pglimit.FixedWindow}}})
	own := newLimiterOn(t, pool, pglimit.Config{Schema: schema, Namespace: "o", Overrides: true, Limits: []pglimit.Limit{{Rate: 10, Period: time.Minute}}})
	for _, tc := range []struct {
		name string
		lim  pglimit.Limiter
		key  string
		d    time.Duration
		want error
	}{
		{"zero", gcra, "k", 0, pglimit.ErrInvalidCost},
		{"negative", gcra, "k", -time.Second, pglimit.ErrInvalidCost},
		{"367 days", gcra, "k", 367 * 24 * time.Hour, pglimit.ErrInvalidCost},
		{"empty key", gcra, "", time.Second, pglimit.ErrInvalidKey},
		{"a window", window, "k", time.Second, pglimit.ErrUnsupported},
		{"per-key limits", own, "k", time.Second, pglimit.ErrUnsupported},
	} {
		if err := pglimit.Pause(ctx, tc.lim, tc.key, tc.d); !errors.Is(err, tc.want) {
			t.Errorf("Pause with %s: %v, want %v", tc.name, err, tc.want)
		}
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.pglimit_upsert`).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("%d rows after refused pauses (%v), want none", rows, err)
	}
}
