package pglimit_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// busyKey runs workers callers of key, spread over lims, for d, and
// returns every admission (one unit each) in the order of its database
// time, how many of them came from a lease, and how many calls were made.
// With bursts, every caller calls for 20 ms of every 100 ms, all in step,
// and rests for the other 80.
func busyKey(t *testing.T, lims []pglimit.Limiter, key string, workers int, d time.Duration, bursts bool) (adm []admission, leased, calls, slow int) {
	t.Helper()
	ctx := context.Background()
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	stop := time.Now().Add(d)
	for i := range workers {
		wg.Go(func() {
			var mine []admission
			n, l, sl := 0, 0, 0
			for now := time.Now(); now.Before(stop); now = time.Now() {
				if phase := now.UnixNano() % int64(100*time.Millisecond); bursts && phase >= int64(20*time.Millisecond) {
					time.Sleep(time.Duration(int64(100*time.Millisecond) - phase))
					continue
				}
				d, err := lims[i%len(lims)].Allow(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				if time.Since(now) > pglimit.NoWaitPatience {
					sl++
				}
				n++
				if d.Allowed {
					mine = append(mine, admission{at: pglimit.DecisionAt(d), units: 1})
					if pglimit.DecisionLeased(d) {
						l++
					}
				}
			}
			mu.Lock()
			adm = append(adm, mine...)
			leased, calls, slow = leased+l, calls+n, slow+sl
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(adm, func(a, b admission) int { return cmp.Compare(a.at, b.at) })
	return adm, leased, calls, slow
}

// checkWindows is checkGCRA in one pass, for many admissions: for every
// i <= j, the units u(i..j) admitted from adm[i] to adm[j] need
// (u(i..j) - Burst)*T <= adm[j].at - adm[i].at. With U the running sum of
// units, that is U(j)*T - at(j) <= Burst*T + min over i <= j of
// (U(i-1)*T - at(i)), which is kept as it goes.
func checkWindows(t *testing.T, adm []admission, l pglimit.Limit) {
	t.Helper()
	T := ceilDiv(l.Period.Microseconds(), int64(l.Rate))
	var (
		units, low int64
		from       int
	)
	for j, a := range adm {
		if v := units*T - a.at; j == 0 || v < low {
			low, from = v, j
		}
		units += a.units
		if over := units*T - a.at - low - int64(l.Burst)*T; over > 0 {
			t.Errorf("admissions %d to %d, %d µs apart, exceed Burst + w/T by %d µs of units", from, j, a.at-adm[from].at, over)
			return
		}
	}
}

func TestLeaseAudit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		limit  pglimit.Limit
		bursts bool // callers rest in step, so leases go idle and give their tails back
	}{
		// All have a Burst*T of 100 ms: a lease is taken while
		// statements take less than half of it, which holds under the race
		// detector and the package's other tests on 2 cores.
		{"binding", pglimit.Limit{Rate: 5000, Period: time.Second, Burst: 500}, false},
		{"free", pglimit.Limit{Rate: 200000, Period: time.Second, Burst: 20000}, false},
		{"bursts", pglimit.Limit{Rate: 5000, Period: time.Second, Burst: 500}, true},
	} {
		for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
			t.Run(fmt.Sprintf("%s/%s", tc.name, s), func(t *testing.T) {
				t.Parallel()
				schema := testdb.Schema(t)
				var lims []pglimit.Limiter
				for range 2 {
					lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Strategy: s, Schema: schema, Limits: []pglimit.Limit{tc.limit}})
					if err != nil {
						t.Fatal(err)
					}
					lims = append(lims, lim)
				}
				given := func() int64 { return pglimit.GivenBack(lims[0]) + pglimit.GivenBack(lims[1]) }
				// A second at a time until a lease has served (and, with
				// bursts, given back), for at most 10 s: on a loaded
				// machine under the race detector, statements can be too
				// slow for either in the first second.
				var (
					adm           []admission
					leased, calls int
				)
				for start, first := time.Now(), true; first || (leased == 0 || tc.bursts && given() == 0) && time.Since(start) < 10*time.Second; first = false {
					more, l, c, _ := busyKey(t, lims, "busy", 16, time.Second, tc.bursts)
					adm, leased, calls = append(adm, more...), leased+l, calls+c
				}
				slices.SortFunc(adm, func(a, b admission) int { return cmp.Compare(a.at, b.at) })
				checkWindows(t, adm, tc.limit)
				t.Logf("%s: %d calls, %d admitted, %d of them leased, %d units given back", t.Name(), calls, len(adm), leased, given())
				if leased == 0 {
					t.Errorf("no admission came from a lease")
				}
				if tc.bursts && given() == 0 {
					// A lease holds units past half of Burst*T only near the
					// end of a full burst; TestLeaseGivesBack makes sure of
					// one. A machine too slow to fill the bursts here
					// audits leases without give-backs.
					t.Logf("no lease gave units back in 10 s: the callers never filled a burst")
				}
			})
		}
	}
}

// takeLease calls key on lim from several goroutines until lim holds a
// lease of it.
func takeLease(t *testing.T, lim pglimit.Limiter, key string) {
	t.Helper()
	waitFor(t, "a lease of "+key, func() bool {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 20 {
					if _, err := lim.Allow(t.Context(), key); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return pglimit.LeaseUnits(lim, key) > 0
	})
}

// A lease that no call comes to gives its last run's units back: the
// record's last write moves the key's TAT back by exactly those units.
// Units are left to give back once the lease has waited half of Burst*T
// only if they were leased near the end of a full burst: another instance
// first fills the key's row to 90%, so that this holds however slowly the
// machine runs.
func TestLeaseGivesBack(t *testing.T) {
	t.Parallel()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	limit := pglimit.Limit{Rate: 4000, Period: time.Second, Burst: 4000}
	var lims [2]pglimit.Limiter
	for i := range lims {
		lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Limits: []pglimit.Limit{limit}})
		if err != nil {
			t.Fatal(err)
		}
		lims[i] = lim
	}
	record := audit(t, pool, schema, pglimit.Upsert)
	if d, err := lims[1].AllowN(t.Context(), "k", 3600); err != nil || !d.Allowed {
		t.Fatalf("filling the row: %+v, %v", d, err)
	}
	lim := lims[0]
	takeLease(t, lim, "k")
	waitFor(t, "the lease's units given back", func() bool { return pglimit.GivenBack(lim) > 0 })
	given := pglimit.GivenBack(lim)
	if most := int64(limit.Burst / 4); given > most {
		t.Errorf("%d units given back; a lease's run holds at most %d", given, most)
	}
	rows := record()
	if len(rows) < 2 {
		t.Fatalf("%d writes recorded", len(rows))
	}
	T := int64(time.Second/time.Microsecond) / int64(limit.Rate)
	last, before := rows[len(rows)-1], rows[len(rows)-2]
	if moved := before.expires - last.expires; moved != given*T {
		t.Errorf("the last write moved the TAT back by %dµs; %d units given back are %dµs", moved, given, given*T)
	}
	t.Logf("%d units given back, %d writes", given, len(rows))
}

// A give-back on a server gone silent ends within Timeout, is counted as
// failed, and gives nothing back: its units are lost, as expired units
// are, and the key's row keeps them.
func TestLeaseGiveBackStalled(t *testing.T) {
	t.Parallel()
	schema := testdb.Schema(t)
	proxy, stalling := testdb.StallPool(t)
	limit := pglimit.Limit{Rate: 4000, Period: time.Second, Burst: 4000}
	const timeout = 300 * time.Millisecond
	lim, err := pglimit.New(stalling, &pglimit.Config{Schema: schema, Limits: []pglimit.Limit{limit}, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: schema, Limits: []pglimit.Limit{limit}})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := other.AllowN(t.Context(), "k", 3600); err != nil || !d.Allowed {
		t.Fatalf("filling the row: %+v, %v", d, err)
	}
	takeLease(t, lim, "k")
	proxy.Stall()
	defer proxy.Unstall()
	stalled := time.Now()
	waitFor(t, "a failed give-back", func() bool { return pglimit.GiveBackFailures(lim) > 0 })
	// The lease waits half of Burst*T (0.5 s) before it gives back, then
	// its statement waits Timeout at most.
	if took, most := time.Since(stalled), time.Second/2+timeout+time.Second; took > most {
		t.Errorf("the give-back failed %s after the stall; a lease's quiet and Timeout bound it to %s, with a second to spare", took, most)
	}
	if given := pglimit.GivenBack(lim); given != 0 {
		t.Errorf("%d units given back on a stalled server", given)
	}
	if units := pglimit.LeaseUnits(lim, "k"); units != 0 {
		t.Errorf("the lease holds %d units after its give-back failed; they are lost", units)
	}
}

// A Reset drops the key's leases: at once on the instance that made it, and
// within milliseconds on another instance that follows Resets through an
// Invalidator. An instance without one keeps handing out its lease.
func TestLeaseReset(t *testing.T) {
	t.Parallel()
	inv := startInvalidator(t, "pglimit-test-lease-reset")
	schema := testdb.Schema(t)
	limit := []pglimit.Limit{{Rate: 1000, Period: time.Second, Burst: 1000}}
	newLim := func(inv *pglimit.Invalidator) pglimit.Limiter {
		lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: schema, Limits: limit, Invalidator: inv})
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}
	a, b, c := newLim(nil), newLim(inv), newLim(nil)

	takeLease(t, a, "own")
	if err := a.Reset(t.Context(), "own"); err != nil {
		t.Fatal(err)
	}
	if n := pglimit.LeaseUnits(a, "own"); n != 0 {
		t.Errorf("a holds %d units of its lease after its own Reset", n)
	}

	takeLease(t, b, "k")
	takeLease(t, c, "k")
	if err := a.Reset(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	// Unused units expire at the limit's rate, one a millisecond: b must
	// drop its lease long before that could empty it.
	reset := time.Now()
	for pglimit.LeaseUnits(b, "k") > 0 {
		if time.Since(reset) > 50*time.Millisecond {
			t.Fatalf("b holds %d units of its lease 50ms after the Reset", pglimit.LeaseUnits(b, "k"))
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Logf("b dropped its lease %s after the Reset", time.Since(reset))
	if n := pglimit.LeaseUnits(c, "k"); n == 0 {
		t.Errorf("c, without an Invalidator, dropped its lease too: is the test's lease too short?")
	}
}

// NoWait refuses a request only when the row is held longer than an
// admission holds it: one key, from two instances, under a limit that
// fits every request (a burst of 100,000 at 900 a second, too slow to
// lease), admits every request, though the instances' admissions hold the
// row in turn all the time. Not parallel: with the package's other tests
// running, a commit on a 2-core machine can take longer than NoWait's
// patience, and that refusal would be right. So can one under the load of
// other packages' tests: an admission whose call took longer than the
// patience may have held the row that long, and each of the other 15
// workers may have been refused behind it, so the test allows that many
// refusals for each such call.
func TestNoWaitAdmitsWhatFits(t *testing.T) {
	schema := testdb.Schema(t)
	limit := pglimit.Limit{Rate: 900, Period: time.Second, Burst: 100_000}
	var lims []pglimit.Limiter
	for range 2 {
		lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Strategy: pglimit.NoWait, Schema: schema, Limits: []pglimit.Limit{limit}})
		if err != nil {
			t.Fatal(err)
		}
		lims = append(lims, lim)
	}
	const workers = 16
	adm, leased, calls, slow := busyKey(t, lims, "fits", workers, time.Second, false)
	if leased > 0 {
		t.Fatalf("%d admissions leased: the limit is meant not to lease", leased)
	}
	if refused := calls - len(adm); refused > (workers-1)*slow {
		t.Errorf("NoWait admitted %d of %d requests that all fit the limit, with %d calls slower than its patience (%s)",
			len(adm), calls, slow, pglimit.NoWaitPatience)
	}
	t.Logf("%d of %d admitted; %d calls slower than the patience", len(adm), calls, slow)
}
