package pglimittest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

func TestMain(m *testing.M) { pglimittest.Main(m) }

// The sixth export of a day is refused, and the next day it passes, in a
// test that waits for nothing: two instances on one Clock.
func TestClockCalendarDay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := pglimittest.NewClock(t)
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	clock.Set(time.Date(2026, 11, 26, 22, 30, 0, 0, paris))
	cfg := pglimit.Config{Schema: pglimittest.Schema(t), Limits: []pglimit.Limit{
		{Name: "exports", Rate: 5, Algorithm: pglimit.FixedWindow, Calendar: "day", TimeZone: "Europe/Paris"},
	}}
	a, err := pglimit.New(clock.Pool(t), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pglimit.New(clock.Pool(t), &cfg)
	if err != nil {
		t.Fatal(err)
	}

	for i, lim := range []pglimit.Limiter{a, b, a, b, a} {
		if d, err := lim.Allow(ctx, "alice"); err != nil || !d.Allowed {
			t.Fatalf("export %d: %+v, %v", i+1, d, err)
		}
	}
	d, err := b.Allow(ctx, "alice")
	if err != nil || d.Allowed || d.RetryAfter != 90*time.Minute {
		t.Fatalf("the 6th export at 22:30 in Paris: %+v, %v; want refused until midnight, in 1h30m exactly", d, err)
	}
	clock.Advance(d.RetryAfter - time.Microsecond)
	if d, err := a.Allow(ctx, "alice"); err != nil || d.Allowed || d.RetryAfter != time.Microsecond {
		t.Fatalf("a microsecond before midnight: %+v, %v; want refused for 1µs", d, err)
	}
	clock.Advance(time.Microsecond)
	if d, err := a.Allow(ctx, "alice"); err != nil || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("at midnight in Paris: %+v, %v; want a new day's quota", d, err)
	}
	if got, want := clock.Now(), time.Date(2026, 11, 27, 0, 0, 0, 0, paris); !got.Equal(want) {
		t.Errorf("Clock.Now() = %s, want %s", got, want)
	}
}

// GCRA, Reset, Inspect and a key's own limits for an hour follow the
// Clock, and concurrent callers at one frozen instant share the burst
// exactly.
func TestClockGCRA(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := pglimittest.NewClock(t)
	pool := clock.Pool(t)
	cfg := pglimit.Config{Schema: pglimittest.Schema(t), Namespace: "gcra", Overrides: true, Limits: []pglimit.Limit{
		{Name: "per-hour", Rate: 2, Period: time.Hour, Burst: 2},
	}}
	lim, err := pglimit.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	admitted := 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			d, err := lim.Allow(ctx, "bob")
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if d.Allowed {
				admitted++
			}
		})
	}
	wg.Wait()
	if admitted != 2 {
		t.Fatalf("8 callers at one instant: %d admitted, want the burst of 2", admitted)
	}
	st, err := pglimit.Inspect(ctx, lim, "bob")
	if err != nil || st.Limits[0].RetryAfter != 30*time.Minute || !st.At.Equal(clock.Now()) {
		t.Fatalf("Inspect: %+v, %v; want one unit back in 30 minutes exactly, at the Clock's time", st, err)
	}
	clock.Advance(30 * time.Minute)
	if d, err := lim.Allow(ctx, "bob"); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("30 minutes on: %+v, %v; want one unit", d, err)
	}

	if err := pglimit.SetKeyLimitsFor(ctx, lim, "bob", time.Hour, pglimit.Limit{Name: "per-hour", Burst: 10}); err != nil {
		t.Fatal(err)
	}
	if err := lim.Reset(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	if d, err := lim.AllowN(ctx, "bob", 10); err != nil || !d.Allowed {
		t.Fatalf("after Reset, with a burst of 10 for an hour: %+v, %v", d, err)
	}
	clock.Advance(time.Hour)
	if err := lim.Reset(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.AllowN(ctx, "bob", 10); !errors.Is(err, pglimit.ErrInvalidCost) {
		t.Fatalf("an hour on, the key's own burst lapsed: AllowN(10) = %v, want ErrInvalidCost", err)
	}
}

// Concurrent callers over two limiters at one frozen instant are refused
// with the database's exact wait, however long the round takes in the
// process: a refusal answered from another call's statement (a follower of
// a merged call) is measured at that statement's database time too.
func TestClockRefusalsExact(t *testing.T) {
	t.Parallel()
	const rounds, callers = 10, 20
	ctx := context.Background()
	clock := pglimittest.NewClock(t)
	cfg := pglimit.Config{Schema: pglimittest.Schema(t), Limits: []pglimit.Limit{pglimit.PerMinute(5)}}
	pools := map[string][2]pglimit.DB{}
	one := clock.Pool(t)
	pools["one pool"] = [2]pglimit.DB{one, one}
	pools["two pools"] = [2]pglimit.DB{clock.Pool(t), clock.Pool(t)}
	for name, dbs := range pools {
		var lims [2]pglimit.Limiter
		for i, db := range dbs {
			c := cfg
			c.Namespace = name
			lim, err := pglimit.New(db, &c)
			if err != nil {
				t.Fatal(err)
			}
			lims[i] = lim
		}
		for round := range rounds {
			key := fmt.Sprintf("round-%d", round)
			ds := make([]pglimit.Decision, callers)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range ds {
				wg.Go(func() {
					<-start
					var err error
					if ds[i], err = lims[i%2].Allow(ctx, key); err != nil {
						t.Error(err)
					}
				})
			}
			close(start)
			wg.Wait()
			admitted := 0
			for i, d := range ds {
				switch {
				case d.Allowed:
					admitted++
				case d.RetryAfter != 12*time.Second:
					t.Errorf("%s, round %d, caller %d: refused with RetryAfter %s, want 12s exactly", name, round, i, d.RetryAfter)
				}
			}
			if admitted != 5 {
				t.Errorf("%s, round %d: %d admitted, want the burst of 5", name, round, admitted)
			}
		}
	}
}

// A pool that is not the Clock's reads the real time.
func TestClockOnlyItsPools(t *testing.T) {
	t.Parallel()
	clock := pglimittest.NewClock(t)
	clock.Advance(-24 * time.Hour)
	var real, fake time.Time
	if err := pglimittest.Pool(t).QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&real); err != nil {
		t.Fatal(err)
	}
	if err := clock.Pool(t).QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&fake); err != nil {
		t.Fatal(err)
	}
	if since := time.Since(real); since < 0 || since > time.Minute {
		t.Errorf("another pool's clock_timestamp() = %s, %s from now; want the real time", real, since)
	}
	if !fake.Equal(clock.Now()) || time.Since(fake) < 23*time.Hour {
		t.Errorf("the Clock's pool read %s, want the Clock's %s, a day ago", fake, clock.Now())
	}
}
