package pglimit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// Two limiters without a Namespace on one pool, one with an hour's
// cooldown and one of 100 a second, keep their own state: an admission by
// the first leaves the second's key untouched. They once shared the
// namespace "default", and the second refused the key for 59m59s.
func TestNamespaceUnsetLimitersKeepTheirOwnState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run(string(s), func(t *testing.T) {
			hourly, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: schema, Cooldown: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			fast, err := pglimit.New(pool, &pglimit.Config{Strategy: s, Schema: schema, Limits: []pglimit.Limit{pglimit.PerSecond(100)}})
			if err != nil {
				t.Fatal(err)
			}
			if d, err := hourly.Allow(ctx, "zed"); err != nil || !d.Allowed {
				t.Fatalf("the cooldown's first call: %+v, %v", d, err)
			}
			d, err := fast.Allow(ctx, "zed")
			if err != nil || !d.Allowed {
				t.Fatalf("100/s limiter after the cooldown's admission: allowed %t, RetryAfter %s, err %v; want admitted (its own state)", d.Allowed, d.RetryAfter, err)
			}
			if d, err := hourly.Allow(ctx, "zed"); err != nil || d.Allowed {
				t.Fatalf("the cooldown's second call: %+v, %v; want refused", d, err)
			}
		})
	}
}

// The namespace derived from the limits is pinned: instances of every
// release must derive the same one, or a deploy would start every key
// afresh. A change here is a change of the deployed protocol. The first two
// values were computed apart from the library too: the SHA-256 of
// "17:pglimit.limits.v1;4:gcra;1:1;13:3600000000000;1:1;0:;0:;8:cooldown;"
// begins b9c740b39a6f.
func TestNamespaceDerivedGolden(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	for _, tc := range []struct {
		name string
		cfg  pglimit.Config
		want string
	}{
		{"an hour's cooldown", pglimit.Config{Cooldown: time.Hour}, "default-b9c740b39a6f"},
		{"100 a second", pglimit.Config{Limits: []pglimit.Limit{pglimit.PerSecond(100)}}, "default-665fcbe890a5"},
		{"a rate and a calendar day in Paris", pglimit.Config{Limits: []pglimit.Limit{
			{Name: "per-minute", Rate: 5, Period: time.Minute, Burst: 3},
			{Name: "per-day", Rate: 20, Algorithm: pglimit.FixedWindow, Calendar: "day", TimeZone: "Europe/Paris"},
			{Rate: 7, Period: time.Hour, Algorithm: pglimit.SlidingWindow},
		}}, "default-5058280c8552"},
	} {
		lim, err := pglimit.New(pool, &tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := lim.Policy().Namespace; got != tc.want {
			t.Errorf("%s: derived namespace %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Without a Namespace, limiters share state exactly when they enforce the
// same limits: a Cooldown and the same limit written out derive one
// namespace, and so do configurations that differ only in options that
// leave a row's meaning alone; a change of any field of any limit derives
// another.
func TestNamespaceDerivedFromLimitsOnly(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	namespace := func(cfg pglimit.Config) string {
		t.Helper()
		lim, err := pglimit.New(pool, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		return lim.Policy().Namespace
	}
	base := []pglimit.Limit{
		{Name: "per-minute", Rate: 5, Period: time.Minute, Burst: 3},
		{Name: "per-day", Rate: 20, Algorithm: pglimit.FixedWindow, Calendar: "day", TimeZone: "Europe/Paris"},
	}
	with := func(edit func(ls []pglimit.Limit)) pglimit.Config {
		ls := append([]pglimit.Limit(nil), base...)
		edit(ls)
		return pglimit.Config{Limits: ls}
	}
	want := namespace(pglimit.Config{Limits: base})

	same := map[string]pglimit.Config{
		"other options": {
			Limits: base, Strategy: pglimit.NoWait, Table: "pglimit_nowait_unlogged", Timeout: time.Second,
			Shadow: true, AsyncCommit: true, Fallback: &pglimit.Fallback{Limits: []pglimit.Limit{pglimit.PerSecond(10)}},
		},
	}
	for name, cfg := range same {
		if got := namespace(cfg); got != want {
			t.Errorf("%s: namespace %q, want %q as without them", name, got, want)
		}
	}
	for name, pair := range map[string][2]pglimit.Limit{
		"a limit's defaults": {{Rate: 5, Period: time.Minute}, {Name: "5-per-1m0s", Rate: 5, Period: time.Minute, Burst: 1, Algorithm: pglimit.GCRA}},
		"a calendar's zone": {
			{Name: "per-day", Rate: 20, Algorithm: pglimit.FixedWindow, Calendar: "day"},
			{Name: "per-day", Rate: 20, Algorithm: pglimit.FixedWindow, Calendar: "day", TimeZone: "UTC"},
		},
	} {
		implicit, written := namespace(pglimit.Config{Limits: pair[:1]}), namespace(pglimit.Config{Limits: pair[1:]})
		if implicit != written {
			t.Errorf("%s written out: namespace %q, want %q as without them", name, written, implicit)
		}
	}
	cooldown := namespace(pglimit.Config{Cooldown: time.Hour})
	if got := namespace(pglimit.Config{Limits: []pglimit.Limit{{Name: "cooldown", Rate: 1, Period: time.Hour, Burst: 1}}}); got != cooldown {
		t.Errorf("the cooldown written out as a limit: namespace %q, want the Cooldown's %q", got, cooldown)
	}
	if cooldown == want {
		t.Errorf("a cooldown and two other limits derive one namespace, %q", want)
	}

	differ := map[string]pglimit.Config{
		"rate":      with(func(ls []pglimit.Limit) { ls[0].Rate = 6 }),
		"period":    with(func(ls []pglimit.Limit) { ls[0].Period = 2 * time.Minute }),
		"burst":     with(func(ls []pglimit.Limit) { ls[0].Burst = 4 }),
		"name":      with(func(ls []pglimit.Limit) { ls[0].Name = "per-min" }),
		"calendar":  with(func(ls []pglimit.Limit) { ls[1].Calendar = "week" }),
		"time zone": with(func(ls []pglimit.Limit) { ls[1].TimeZone = "UTC" }),
		"algorithm": with(func(ls []pglimit.Limit) {
			ls[0] = pglimit.Limit{Name: "per-minute", Rate: 5, Period: time.Minute, Algorithm: pglimit.SlidingWindow}
		}),
		"order":    with(func(ls []pglimit.Limit) { ls[0], ls[1] = ls[1], ls[0] }),
		"fewer":    {Limits: base[:1]},
		"one more": {Limits: append(append([]pglimit.Limit(nil), base...), pglimit.PerHour(100))},
	}
	seen := map[string]string{want: "the base"}
	for name, cfg := range differ {
		got := namespace(cfg)
		if other, dup := seen[got]; dup {
			t.Errorf("a change of %s derives %q, as %s does", name, got, other)
		}
		seen[got] = name
	}
}

// The documented way to change a limiter's limits in a rolling deploy:
// keep its Namespace. While old and new instances both decide, each
// applies its own limits to the state the other left (docs/limits.md,
// "Changing limits"): time a GCRA limit booked stays booked, a window's
// count stays counted, and nothing errors.
func TestNamespaceRollingChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	open := func(t *testing.T, cfg pglimit.Config) pglimit.Limiter {
		t.Helper()
		cfg.Schema = schema
		lim, err := pglimit.New(pool, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}
	allow := func(t *testing.T, lim pglimit.Limiter, key string) pglimit.Decision {
		t.Helper()
		d, err := lim.Allow(ctx, key)
		if err != nil {
			t.Fatalf("%s on %q: %v", lim.Policy().Limits[0].Name, key, err)
		}
		return d
	}

	// A cooldown shortened from an hour to a minute: a key admitted by an
	// old instance waits out its hour on the new ones too, and a key
	// admitted by a new one waits its minute on the old ones.
	for _, s := range pglimit.Strategies() {
		t.Run("cooldown/"+string(s), func(t *testing.T) {
			ns := "export-" + string(s)
			old := open(t, pglimit.Config{Strategy: s, Namespace: ns, Cooldown: time.Hour})
			cur := open(t, pglimit.Config{Strategy: s, Namespace: ns, Cooldown: time.Minute})
			if d := allow(t, old, "a"); !d.Allowed {
				t.Fatalf("old, first call on a: %+v", d)
			}
			if d := allow(t, cur, "a"); d.Allowed || d.RetryAfter < 59*time.Minute {
				t.Errorf("new after old admitted a: allowed %t, RetryAfter %s; want refused for the rest of the hour", d.Allowed, d.RetryAfter)
			}
			if d := allow(t, cur, "b"); !d.Allowed {
				t.Fatalf("new, first call on b: %+v", d)
			}
			if d := allow(t, old, "b"); d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > time.Minute {
				t.Errorf("old after new admitted b: allowed %t, RetryAfter %s; want refused for the rest of the minute", d.Allowed, d.RetryAfter)
			}
			if d := allow(t, cur, "b"); d.Allowed {
				t.Errorf("new, second call on b within its minute: admitted")
			}
		})
	}

	// A rate and a daily quota both raised: 6 an hour with a burst of 6
	// and 5 a day, then 12 an hour with a burst of 12 and 8 a day. Calls
	// alternate between an old and a new instance. The day's count carries
	// over: the old instance stops at its 5, the new one at its 8, and the
	// key gets 8 in all, not 5 + 8. So does the hour's booked time: ten
	// minutes for each of the old's 3 admissions and five for each of the
	// new's 5 leave 55 booked, over the old's hour once its 11th call
	// books ten more, within the new's once its 12th books five.
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run("quota/"+string(s), func(t *testing.T) {
			ns := "api-" + string(s)
			limits := func(hourly, daily int) []pglimit.Limit {
				return []pglimit.Limit{
					{Name: "per-hour", Rate: hourly, Period: time.Hour, Burst: hourly},
					{Name: "per-day", Rate: daily, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
				}
			}
			old := open(t, pglimit.Config{Strategy: s, Namespace: ns, Limits: limits(6, 5)})
			cur := open(t, pglimit.Config{Strategy: s, Namespace: ns, Limits: limits(12, 8)})
			// Per call, the limits that refuse it; none: admitted.
			want := []string{
				"", "", // old, new
				"", "",
				"", "",
				"per-day", "",
				"per-day", "",
				"per-hour per-day", "per-day",
			}
			admitted := 0
			for i, w := range want {
				lim, who := old, "old"
				if i%2 == 1 {
					lim, who = cur, "new"
				}
				d := allow(t, lim, "k")
				var violated []string
				for _, l := range d.Violated() {
					violated = append(violated, l.Name)
				}
				if got := strings.Join(violated, " "); d.Allowed != (w == "") || got != w {
					t.Fatalf("call %d (%s): allowed %t, refused by %q; want refused by %q (%+v)", i+1, who, d.Allowed, got, w, d)
				}
				if d.Allowed {
					admitted++
				}
			}
			if admitted != 8 {
				t.Errorf("%d admitted in all, want the new quota's 8", admitted)
			}
		})
	}
}
