package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// The helpers are GCRA limits of n per period with a burst of n.
func TestPerHelpers(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		got    pglimit.Limit
		period time.Duration
	}{
		{pglimit.PerSecond(5), time.Second},
		{pglimit.PerMinute(5), time.Minute},
		{pglimit.PerHour(5), time.Hour},
		{pglimit.PerDay(5), 24 * time.Hour},
	} {
		want := pglimit.Limit{Rate: 5, Period: tt.period, Burst: 5, Algorithm: pglimit.GCRA}
		if tt.got != want {
			t.Errorf("got %+v, want %+v", tt.got, want)
		}
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

	// A zero Cooldown, which is also an unset one, names the bound as a
	// negative one does.
	for _, d := range []time.Duration{0, -time.Second} {
		_, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Cooldown: d})
		if want := "Cooldown must be positive and at most 8784h0m0s, got " + d.String(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New with Cooldown %s: %v; want a message with %q", d, err, want)
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
