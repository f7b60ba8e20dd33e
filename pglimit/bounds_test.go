package pglimit_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// auditRow is one write to a limiter's row, as the audit trigger saw it.
type auditRow struct {
	at      int64 // clock_timestamp() in the trigger, µs since the epoch
	key     string
	state   []int64
	expires int64
}

// audit installs a trigger that records every INSERT and UPDATE of the
// strategy's table in schema, and returns a function that reads the record
// in the order of writes.
func audit(t *testing.T, pool *pgxpool.Pool, schema string, s pglimit.Strategy) func() []auditRow {
	t.Helper()
	ctx := context.Background()
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	table := q("pglimit_" + string(s))
	for _, stmt := range []string{
		`CREATE TABLE ` + q("audit") + ` (id bigserial PRIMARY KEY, at timestamptz NOT NULL, key text NOT NULL, state bigint[], expires_at timestamptz NOT NULL)`,
		`CREATE FUNCTION ` + q("audit_row") + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ` + q("audit") + ` (at, key, state, expires_at) VALUES (clock_timestamp(), NEW.key, NEW.state, NEW.expires_at);
    RETURN NULL;
END $$`,
		`CREATE TRIGGER audit AFTER INSERT OR UPDATE ON ` + table + ` FOR EACH ROW EXECUTE FUNCTION ` + q("audit_row") + `()`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("audit trigger: %v", err)
		}
	}
	return func() []auditRow { return auditRecord(t, pool, schema) }
}

// auditRecord reads the record of audit's trigger in schema, through pool:
// on a standby, what it has replayed.
func auditRecord(t *testing.T, pool *pgxpool.Pool, schema string) []auditRow {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT (extract(epoch FROM at) * 1000000)::bigint, key, state, (extract(epoch FROM expires_at) * 1000000)::bigint FROM `+
		pgx.Identifier{schema, "audit"}.Sanitize()+` ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (a auditRow, err error) {
		err = r.Scan(&a.at, &a.key, &a.state, &a.expires)
		return a, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// bigPool returns a pool of maxConns connections, closed when the test
// ends, with the empty search_path of testdb.Pool.
func bigPool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return openPool(t, bigPoolConfig(t, maxConns))
}

// bigPoolConfig is bigPool's configuration, for a test to add to.
func bigPoolConfig(t *testing.T, maxConns int32) *pgxpool.Config {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	return cfg
}

// hammer sends requests of random cost (1 to maxN) for key from workers
// goroutines spread over lims until d has passed, and returns the
// admissions the decisions reported, in the order of their database time.
func hammer(t *testing.T, lims []pglimit.Limiter, workers int, key string, maxN int, d time.Duration) []admission {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var adm []admission
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 0))
			for time.Now().Before(stop) {
				d, err := lims[w%len(lims)].AllowN(ctx, key, 1+rng.IntN(maxN))
				if err != nil {
					t.Errorf("AllowN: %v", err)
					return
				}
				if d.Allowed {
					mu.Lock()
					adm = append(adm, admission{at: pglimit.DecisionAt(d), units: int64(d.Granted), leased: pglimit.DecisionLeased(d)})
					mu.Unlock()
				}
				time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	slices.SortFunc(adm, func(a, b admission) int { return cmp.Compare(a.at, b.at) })
	return adm
}

// admission is one write of the record: its time and the units it
// admitted; or, when leased, units handed out from a lease at an upper
// estimate of the database time.
type admission struct {
	at, units int64
	leased    bool
}

// checkGCRA checks that no interval admits more than Burst + w/T units, w
// the interval's length: for every pair of admissions i <= j, the units of
// i..j minus Burst, times T, is at most the time between them. It returns
// the tightest margin (µs) found.
func checkGCRA(t *testing.T, name string, adm []admission, l pglimit.Limit) int64 {
	t.Helper()
	T := ceilDiv(l.Period.Microseconds(), int64(l.Rate))
	margin := int64(1) << 62
	for i := range adm {
		var units int64
		for j := i; j < len(adm); j++ {
			units += adm[j].units
			m := adm[j].at - adm[i].at - (units-int64(l.Burst))*T
			margin = min(margin, m)
			if m < 0 {
				t.Errorf("%s: %d units admitted between %d and %d µs (%d µs apart); GCRA %d per %s with burst %d admits at most %d + %d/%d",
					name, units, adm[i].at, adm[j].at, adm[j].at-adm[i].at, l.Rate, l.Period, l.Burst, l.Burst, adm[j].at-adm[i].at, T)
				return margin
			}
		}
	}
	return margin
}

// pair matches the record's writes with the admissions the decisions
// reported, in order, and checks that each write is what its decisions say,
// at their database time: for a GCRA limit the TAT moved to max(TAT, time)
// + units*T, for a fixed window the count grown by the units, or a window
// started at the decision's time. Concurrent calls on a key may merge into
// one write: a write admits the next admissions of one database time, one
// after the other, as many as lead to the state it wrote. It returns the
// longest delay from a decision's clock read to its trigger's.
func pair(t *testing.T, rows []auditRow, adm []admission, limits []pglimit.Limit) (lag int64) {
	t.Helper()
	if len(limits) == 1 && limits[0].Algorithm == pglimit.GCRA {
		return pairMerged(t, rows, adm, limits[0])
	}
	k := 0
	var prev []int64
	for i, r := range rows {
		if k == len(adm) {
			t.Fatalf("write %d (state %v) has no admission left to account for it", i, r.state)
		}
		at, first, state := adm[k].at, k, prev
		for {
			state = admitted(state, at, adm[k].units, limits)
			k++
			if slices.Equal(state, r.state) || k == len(adm) || adm[k].at != at {
				break
			}
		}
		if !slices.Equal(state, r.state) {
			t.Fatalf("write %d: state %v after %v; the admissions %d to %d at %d µs leave %v", i, r.state, prev, first, k-1, at, state)
		}
		lag = max(lag, r.at-at)
		if r.at < at {
			t.Errorf("write %d recorded at %d µs, before its decision's time %d µs", i, r.at, at)
		}
		prev = r.state
	}
	if k != len(adm) {
		t.Fatalf("the record's %d writes account for %d admissions; the decisions reported %d", len(rows), k, len(adm))
	}
	return lag
}

// admitted is the state limits keep after an admission of units at (µs),
// from prev (nil for none), by docs/limits.md.
func admitted(prev []int64, at, units int64, limits []pglimit.Limit) []int64 {
	out := make([]int64, 0, 3*len(limits))
	for j, l := range limits {
		var was []int64
		if prev != nil {
			was = prev[3*j : 3*j+3]
		}
		var cur []int64
		switch l.Algorithm {
		case pglimit.GCRA:
			tat := int64(math.MinInt64)
			if was != nil {
				tat = was[0]
			}
			cur = []int64{max(tat, at) + units*ceilDiv(l.Period.Microseconds(), int64(l.Rate)), 0, 0}
		case pglimit.FixedWindow:
			cur = []int64{at, units, 0}
			if was != nil && at < was[0]+l.Period.Microseconds() {
				cur = []int64{was[0], was[1] + units, 0}
			}
		case pglimit.SlidingWindow:
			p := l.Period.Microseconds()
			cur = []int64{at / p * p, 0, units}
			switch {
			case was != nil && was[0] == cur[0]:
				cur[1], cur[2] = was[1], was[2]+units
			case was != nil && was[0] == cur[0]-p:
				cur[1] = was[2]
			}
		}
		out = append(out, cur...)
	}
	return out
}

// pairMerged is pair for a single GCRA limit, whose concurrent calls on a
// key merge into one write: a write admits the next admissions of one
// database time, in order, as many as move the TAT from max(TAT, time) to
// what it wrote, each by its units*T.
func pairMerged(t *testing.T, rows []auditRow, adm []admission, l pglimit.Limit) (lag int64) {
	t.Helper()
	T := ceilDiv(l.Period.Microseconds(), int64(l.Rate))
	k := 0
	for i, r := range rows {
		prev := int64(math.MinInt64)
		if i > 0 {
			prev = rows[i-1].expires
		}
		if k == len(adm) {
			t.Fatalf("write %d (TAT %d µs) has no admission left to account for it", i, r.expires)
		}
		at, units, first := adm[k].at, int64(0), k
		for k < len(adm) && adm[k].at == at && max(prev, at)+units*T != r.expires {
			units += adm[k].units
			k++
		}
		if max(prev, at)+units*T != r.expires {
			t.Fatalf("write %d: TAT %d µs, want max(%d, %d) + units*T for the admissions %d.. at that time (%d units: %d µs)", i, r.expires, prev, at, first, units, max(prev, at)+units*T)
		}
		lag = max(lag, r.at-at)
		if r.at < at {
			t.Errorf("write %d recorded at %d µs, before its decision's time %d µs", i, r.at, at)
		}
	}
	if k != len(adm) {
		t.Fatalf("the record's %d writes account for %d admissions; the decisions reported %d", len(rows), k, len(adm))
	}
	return lag
}

// unitsWritten is how many units the record's writes of key admitted under
// a single GCRA limit of emission interval T (µs), much longer than the time
// between a decision and its trigger: each write moved the TAT by its units
// past max(the previous TAT, its time).
func unitsWritten(rows []auditRow, key string, T int64) int64 {
	var units int64
	prev := int64(math.MinInt64)
	for _, r := range rows {
		if r.key == key {
			units += (r.expires - max(prev, r.at) + T/2) / T
			prev = r.expires
		}
	}
	return units
}

// checkFixed checks from the record that each window admits at most Rate
// units, and that a window starts only after the last one ended (pair has
// checked that every admission falls within the window it counts in). The
// state of the window is at offset in each write. It returns the number of
// windows and the largest count.
func checkFixed(t *testing.T, name string, rows []auditRow, offset int, l pglimit.Limit) (windows int, most int64) {
	t.Helper()
	p := l.Period.Microseconds()
	for i, r := range rows {
		w, c := r.state[offset], r.state[offset+1]
		if i == 0 || w != rows[i-1].state[offset] {
			windows++
			if i > 0 && w < rows[i-1].state[offset]+p {
				t.Errorf("%s: window %d µs starts before window %d µs ended", name, w, rows[i-1].state[offset])
			}
		}
		if c > int64(l.Rate) {
			t.Errorf("%s: window %d µs counts %d, more than the rate %d", name, w, c, l.Rate)
		}
		most = max(most, c)
	}
	return windows, most
}

// checkSliding checks that no interval of length Period admits more than
// 2*Rate units, and returns the most units found in one.
func checkSliding(t *testing.T, name string, adm []admission, l pglimit.Limit) (most int64) {
	t.Helper()
	p := l.Period.Microseconds()
	for i := range adm {
		var units int64
		for j := i; j < len(adm) && adm[j].at-adm[i].at <= p; j++ {
			units += adm[j].units
		}
		if units > 2*int64(l.Rate) {
			t.Errorf("%s: %d units admitted within %s from %d µs; the sliding window admits at most 2*%d", name, units, l.Period, adm[i].at, l.Rate)
		}
		most = max(most, units)
	}
	return most
}

// Under a hot key hammered from two pools, GCRA never admits more than
// Burst + Rate*w/Period in any interval of length w, nor a fixed window
// more than Rate, nor either of them when a key has both limits at once.
//
// An audit trigger records every write to the key's row. Each write is
// paired with the admission that reported it, and must be exactly what
// that decision says at its database time (pair): so the record proves
// the admissions, and their times are the ones the database decided and
// wrote with, to the microsecond. The trigger's own clock_timestamp() is
// no substitute for those times: it reads the clock when the statement
// ends, which on a loaded 2-core machine was measured up to 55ms after the
// decision's clock read, far beyond a 1ms slack.
func TestConcurrencyBounds(t *testing.T) {
	t.Parallel()
	gcra := pglimit.Limit{Name: "gcra", Rate: 10, Period: 200 * time.Millisecond, Burst: 4}
	// Fast enough to lease (docs/limits.md, "Leases"), with a Burst*T of
	// 100 ms, so that it leases while statements take less than 50 ms.
	leasing := pglimit.Limit{Name: "leasing", Rate: 4000, Period: time.Second, Burst: 400}
	fixed := pglimit.Limit{Name: "fixed", Rate: 7, Period: 300 * time.Millisecond, Algorithm: pglimit.FixedWindow}
	sliding := pglimit.Limit{Name: "sliding", Rate: 6, Period: 250 * time.Millisecond, Algorithm: pglimit.SlidingWindow}
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		for _, tc := range []struct {
			name   string
			limits []pglimit.Limit
			maxN   int
		}{
			{"gcra", []pglimit.Limit{gcra}, 1}, // a single GCRA limit records no count: one unit each
			{"fixed", []pglimit.Limit{fixed}, 2},
			{"gcra+fixed", []pglimit.Limit{gcra, fixed}, 2},
			{"sliding", []pglimit.Limit{sliding}, 2},
			{"gcra+fixed+sliding", []pglimit.Limit{gcra, fixed, sliding}, 2},
			{"leasing", []pglimit.Limit{leasing}, 3},
		} {
			t.Run(fmt.Sprintf("%s/%s", s, tc.name), func(t *testing.T) {
				t.Parallel()
				pools := []*pgxpool.Pool{testdb.Pool(t), testdb.Pool(t)}
				schema := testdb.Schema(t)
				record := audit(t, pools[0], schema, s)
				var lims []pglimit.Limiter
				for _, p := range pools {
					lim, err := pglimit.New(p, &pglimit.Config{Strategy: s, Schema: schema, Limits: tc.limits, Timeout: 10 * time.Second})
					if err != nil {
						t.Fatal(err)
					}
					lims = append(lims, lim)
				}
				adm := hammer(t, lims, 8, "hot", tc.maxN, 1500*time.Millisecond)
				rows := record()
				if tc.limits[0] == leasing {
					checkLeased(t, rows, adm, leasing)
					return
				}
				lag := pair(t, rows, adm, tc.limits)
				var units int64
				for _, a := range adm {
					units += a.units
				}
				figures := fmt.Sprintf("%s %s: %d units admitted in %d writes over 1.5s, trigger up to %dµs after the decision's clock", s, tc.name, units, len(rows), lag)
				if tc.limits[0].Algorithm == pglimit.GCRA {
					margin := checkGCRA(t, tc.name, adm, gcra)
					figures += fmt.Sprintf("; GCRA bound's tightest margin %dµs", margin)
				}
				for i, l := range tc.limits {
					switch l.Algorithm {
					case pglimit.FixedWindow:
						windows, most := checkFixed(t, tc.name, rows, 3*i, l)
						figures += fmt.Sprintf("; %d fixed windows, at most %d of %d in one", windows, most, l.Rate)
					case pglimit.SlidingWindow:
						most := checkSliding(t, tc.name, adm, l)
						figures += fmt.Sprintf("; sliding window: at most %d units in %s (bound 2*%d)", most, l.Period, l.Rate)
					}
				}
				t.Log(figures)
			})
		}
	}
}

// checkLeased checks the admissions of a limit that leases. Their writes do
// not pair with them one for one (a write takes a lease, handed out later),
// so the record is checked for what a write may do, and the admissions, by
// their database times, against Burst + w/T in every interval: each
// write's TAT is at most its own clock reading plus Burst*T and a lease's
// reach (internal/batch), and the units admitted are no more than the writes
// moved the TAT by.
func checkLeased(t *testing.T, rows []auditRow, adm []admission, l pglimit.Limit) {
	t.Helper()
	T := ceilDiv(l.Period.Microseconds(), int64(l.Rate))
	burstT := int64(l.Burst) * T
	reach := min(burstT/4, 10_000)
	var moved, units, leased int64
	prev := int64(math.MinInt64)
	for i, r := range rows {
		if r.expires > r.at+burstT+reach {
			t.Errorf("write %d: TAT %dµs past its clock, more than Burst*T + reach (%dµs)", i, r.expires-r.at, burstT+reach)
		}
		if prev != math.MinInt64 {
			moved += r.expires - prev
		} else {
			moved += r.expires - r.at + burstT // the first write: at most a full burst
		}
		prev = r.expires
	}
	for _, a := range adm {
		units += a.units
		if a.leased {
			leased += a.units
		}
	}
	if units*T > moved {
		t.Errorf("%d units admitted; the writes moved the TAT by %dµs, room for %d", units, moved, moved/T)
	}
	if leased == 0 {
		t.Errorf("no admission came from a lease: the case tests nothing new")
	}
	checkWindows(t, adm, l)
	t.Logf("%d units admitted in %d writes over 1.5s, %d of them leased", units, len(rows), leased)
}

// 200 concurrent requests over two pools on one key with a burst of 5 and
// a long period: Upsert admits exactly 5, and the record's writes admitted
// 5 units (concurrent calls on a key may share a write).
// NoWait refuses a request that finds the row locked, so it admits between
// 1 and 5.
func TestConcurrentBurst(t *testing.T) {
	t.Parallel()
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pools := []*pgxpool.Pool{bigPool(t, 20), bigPool(t, 20)}
			schema := testdb.Schema(t)
			// A key whose row is there, long replenished, and a key never seen.
			table := pgx.Identifier{schema, "pglimit_" + string(s)}.Sanitize()
			if _, err := pools[0].Exec(ctx, "INSERT INTO "+table+" (namespace, key, expires_at) VALUES ('burst', 'seen', now() - interval '1 day')"); err != nil {
				t.Fatal(err)
			}
			record := audit(t, pools[0], schema, s)
			var lims []pglimit.Limiter
			for _, p := range pools {
				lim, err := pglimit.New(p, &pglimit.Config{Strategy: s, Schema: schema, Namespace: "burst", Limits: []pglimit.Limit{{Rate: 5, Period: time.Hour, Burst: 5}}, Timeout: 30 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				lims = append(lims, lim)
			}
			for _, key := range []string{"new", "seen"} {
				var admitted atomic.Int64
				var errs []error
				var mu sync.Mutex
				var wg sync.WaitGroup
				start := make(chan struct{})
				for i := range 200 {
					wg.Go(func() {
						<-start
						d, err := lims[i%2].Allow(ctx, key)
						if err != nil {
							mu.Lock()
							errs = append(errs, err)
							mu.Unlock()
						}
						if d.Allowed {
							admitted.Add(1)
						}
					})
				}
				close(start)
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
				n := admitted.Load()
				units := unitsWritten(record(), key, time.Hour.Microseconds()/5)
				t.Logf("%s, key %q: 200 concurrent requests, burst 5: %d admitted, %d units written", s, key, n, units)
				if units != n {
					t.Errorf("%d admitted, but the record's writes admitted %d units", n, units)
				}
				switch {
				case s == pglimit.Upsert && n != 5:
					t.Errorf("%d admitted, want exactly 5", n)
				case n < 1 || n > 5:
					t.Errorf("%d admitted, want 1 to 5", n)
				}
			}
		})
	}
}
