package main

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// rate is 10 per second with a burst of 2: T = 100 ms.
var rate = pglimit.Limit{Name: "rate", Rate: 10, Period: time.Second, Burst: 2}

const msUS = int64(time.Millisecond / time.Microsecond)

// exact is an admission decided at ms milliseconds, exactly known.
func exact(ms int64, state ...int64) auditRow {
	return auditRow{stmt: ms * msUS, at: ms * msUS, state: state}
}

func TestCheckRecordLimits(t *testing.T) {
	t.Parallel()
	window := pglimit.Limit{Name: "window", Rate: 2, Period: time.Second, Algorithm: pglimit.FixedWindow}
	sliding := pglimit.Limit{Name: "sliding", Rate: 2, Period: time.Second, Algorithm: pglimit.SlidingWindow}
	sec := int64(time.Second / time.Microsecond)
	tests := []struct {
		name     string
		limits   []pglimit.Limit
		rows     []auditRow
		violated bool
		headroom map[string]int
	}{
		{
			name:     "a burst, then the rate",
			limits:   []pglimit.Limit{rate},
			rows:     []auditRow{exact(0), exact(0), exact(100), exact(200), exact(300)},
			headroom: map[string]int{"rate": 0},
		},
		{
			name:     "one more than the burst at once",
			limits:   []pglimit.Limit{rate},
			rows:     []auditRow{exact(0), exact(0), exact(1)},
			violated: true,
		},
		{
			// The count over the whole span is fine (5 in 300 ms allows 5);
			// 4 within 150 ms is not (allows 3).
			name:     "too many inside a span that allows them",
			limits:   []pglimit.Limit{rate},
			rows:     []auditRow{exact(0), exact(0), exact(100), exact(150), exact(300)},
			violated: true,
		},
		{
			// The statements started long before their triggers ran: the
			// three may have been decided 100 ms apart and more.
			name:   "decisions not provably too close",
			limits: []pglimit.Limit{rate},
			rows: []auditRow{{stmt: -150 * msUS, at: 0}, {stmt: -120 * msUS, at: 1 * msUS},
				{stmt: -100 * msUS, at: 2 * msUS}},
		},
		{
			// The same, but each decision waited for the previous one's
			// lock: the previous trigger's time bounds it from below, so
			// the last three were decided within 3 ms.
			name:   "a decision is no earlier than the previous admission",
			limits: []pglimit.Limit{rate},
			rows: []auditRow{{stmt: -150 * msUS, at: 0}, {stmt: -150 * msUS, at: 1 * msUS},
				{stmt: -150 * msUS, at: 2 * msUS}, {stmt: -150 * msUS, at: 3 * msUS}},
			violated: true,
		},
		{
			name:     "fixed window full, then the next",
			limits:   []pglimit.Limit{window},
			rows:     []auditRow{exact(0, 0, 1, 0), exact(10, 0, 2, 0), exact(1000, sec, 1, 0)},
			headroom: map[string]int{"window": 0},
		},
		{
			name:     "fixed window over its quota",
			limits:   []pglimit.Limit{window},
			rows:     []auditRow{exact(0, 0, 1, 0), exact(10, 0, 2, 0), exact(20, 0, 2, 0)},
			violated: true,
		},
		{
			name:     "fixed windows overlapping",
			limits:   []pglimit.Limit{window},
			rows:     []auditRow{exact(0, 0, 1, 0), exact(500, 500*msUS, 1, 0)},
			violated: true,
		},
		{
			name:     "sliding window not aligned",
			limits:   []pglimit.Limit{sliding},
			rows:     []auditRow{exact(0, 5, 0, 1)},
			violated: true,
		},
		{
			// Each limit alone would pass the first two; the window's
			// state shows a third admission in its window.
			name:   "several limits: one of them broken",
			limits: []pglimit.Limit{rate, window},
			rows: []auditRow{exact(0, 0, 0, 0, 0, 1, 0), exact(100, 0, 0, 0, 0, 2, 0),
				exact(200, 0, 0, 0, 0, 2, 0)},
			violated: true,
		},
		{
			name:     "a state that is not the limits'",
			limits:   []pglimit.Limit{rate, window},
			rows:     []auditRow{exact(0)},
			violated: true,
		},
	}
	for _, tt := range tests {
		c := checkRecordLimits(map[string][]auditRow{"k": tt.rows}, tt.limits)
		if c.ok() == tt.violated {
			t.Errorf("%s: ok %t, want %t: %+v", tt.name, c.ok(), !tt.violated, c)
		}
		if c.Admitted != len(tt.rows) {
			t.Errorf("%s: %d admitted, want %d", tt.name, c.Admitted, len(tt.rows))
		}
		for name, h := range tt.headroom {
			if c.Headroom[name] != h {
				t.Errorf("%s: headroom %v, want %s %d", tt.name, c.Headroom, name, h)
			}
		}
	}
}

func TestCheckClientLimits(t *testing.T) {
	t.Parallel()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	limits := []pglimit.Limit{rate}
	if c := checkClientLimits(map[string][]admission{"k": {at(0), at(0), at(ms(100)), at(ms(200))}}, limits); !c.ok() {
		t.Errorf("a burst then the rate: %+v", c)
	}
	if c := checkClientLimits(map[string][]admission{"k": {at(0), at(ms(1)), at(ms(2))}}, limits); c.ok() {
		t.Errorf("three within 2 ms, burst 2: not flagged: %+v", c)
	}
	// Slow answers: three sent at once, answered 200 ms later, may have
	// been decided 100 ms apart.
	slow := admission{sent: 0, received: ms(200)}
	if c := checkClientLimits(map[string][]admission{"k": {slow, slow, slow}}, limits); !c.ok() {
		t.Errorf("not provably too close: flagged: %+v", c)
	}
	// Windows, from the client: at most 2*Rate within one period.
	window := pglimit.Limit{Name: "window", Rate: 2, Period: time.Second, Algorithm: pglimit.FixedWindow}
	four := map[string][]admission{"k": {at(0), at(ms(1)), at(ms(2)), at(ms(3))}}
	if c := checkClientLimits(four, []pglimit.Limit{window}); !c.ok() {
		t.Errorf("2*Rate across a boundary is allowed: %+v", c)
	}
	four["k"] = append(four["k"], at(ms(4)))
	if c := checkClientLimits(four, []pglimit.Limit{window}); c.ok() {
		t.Errorf("five within 4 ms, 2 per second: not flagged: %+v", c)
	}
}

// The one-pass check of a GCRA limit agrees with the check of every pair:
// on whether some run is over the bound, and on the tightest headroom.
func TestGCRABoundsMatchPairs(t *testing.T) {
	t.Parallel()
	l := pglimit.Limit{Name: "rate", Rate: 1000, Period: time.Second, Burst: 20}
	rng := rand.New(rand.NewPCG(1, 2))
	outcomes := map[bool]int{}
	for trial := range 300 {
		var adm []admission
		at := time.Duration(0)
		for range 50 + rng.IntN(100) {
			at += time.Duration(rng.IntN(1500)) * time.Microsecond
			adm = append(adm, admission{sent: at, received: at + time.Duration(rng.IntN(400))*time.Microsecond})
		}
		latest := make([]time.Duration, len(adm))
		for i, a := range adm {
			latest[i] = a.received
			if i > 0 {
				latest[i] = max(latest[i], latest[i-1])
			}
		}
		var fast, pairs admissionCheck
		gcraBounds(adm, latest, l, &fast)
		pairBounds(len(adm), func(a, b int) time.Duration { return latest[b] - adm[a].sent }, []pglimit.Limit{l}, &pairs)
		if fast.ok() != pairs.ok() || fast.Headroom["rate"] != pairs.Headroom["rate"] {
			t.Fatalf("trial %d: one pass %+v, every pair %+v", trial, fast, pairs)
		}
		outcomes[fast.ok()]++
	}
	if outcomes[true] == 0 || outcomes[false] == 0 {
		t.Errorf("the trials were all alike (ok: %d, over: %d): they test nothing", outcomes[true], outcomes[false])
	}
}

func TestMaxIn(t *testing.T) {
	t.Parallel()
	// 3 per second: T rounds up to 333334 µs, never faster than asked.
	l := pglimit.Limit{Rate: 3, Period: time.Second}
	if got := maxIn(l, time.Second); got != 3 {
		t.Errorf("burst 1, 3 per second, over 1s: %d, want 3 (1 + floor(1s/333334µs))", got)
	}
	if got := maxIn(pglimit.Limit{Rate: 5, Period: time.Minute, Burst: 3}, 0); got != 3 {
		t.Errorf("at once: %d, want the burst", got)
	}
}

func TestCheckRecordLeases(t *testing.T) {
	t.Parallel()
	// T = 1 ms, Burst*T = 10 ms, reach 2.5 ms.
	l := pglimit.Limit{Name: "rate", Rate: 1000, Period: time.Second, Burst: 10}
	prev := func(v int64) *int64 { return &v }
	writes := map[string][]leaseWrite{"k": {
		{expires: 15_000, stmt: 10_000, at: 10_100},                         // a new key: 5 units
		{previous: prev(15_000), expires: 21_000, stmt: 12_000, at: 12_200}, // 6 more, 8.8 ms ahead of its clock
	}}
	if c := checkRecordLeases(writes, l, map[string]int{"k": 11}); !c.ok() || c.MaxAllowed != 11 {
		t.Errorf("11 admissions of 11 units written: %+v", c)
	}
	if c := checkRecordLeases(writes, l, map[string]int{"k": 12}); c.ok() || c.OverAdmitted != 1 {
		t.Errorf("12 admissions of 11 units written: not flagged: %+v", c)
	}
	given := map[string][]leaseWrite{"k": append(slices.Clone(writes["k"]), leaseWrite{previous: prev(21_000), expires: 18_000, stmt: 14_000, at: 14_100})} // 3 given back
	if c := checkRecordLeases(given, l, map[string]int{"k": 9}); c.ok() || c.OverAdmitted != 1 {
		t.Errorf("9 admissions of 11 units written, 3 given back: not flagged: %+v", c)
	}
	given["k"] = append(given["k"], leaseWrite{previous: prev(18_000), expires: 20_000, stmt: 15_000, at: 15_100}) // 2 of them taken again
	if c := checkRecordLeases(given, l, map[string]int{"k": 10}); !c.ok() || c.MaxAllowed != 10 {
		t.Errorf("10 admissions of 10 units: %+v", c)
	}
	writes["k"] = append(writes["k"], leaseWrite{previous: prev(21_000), expires: 25_000, stmt: 12_300, at: 12_400})
	if c := checkRecordLeases(writes, l, map[string]int{"k": 11}); c.ok() || c.Violations != 1 {
		t.Errorf("a TAT 12.6 ms past its clock, beyond Burst*T + reach: not flagged: %+v", c)
	}
}

// A write that merged several calls counts as their admissions: by the
// TAT it moved for a single GCRA limit, by the first window's count for
// general limits, by the first GCRA limit's TAT when there is no window.
func TestUnitsWritten(t *testing.T) {
	window := pglimit.Limit{Name: "window", Rate: 100, Period: time.Minute, Algorithm: pglimit.FixedWindow}
	sliding := pglimit.Limit{Name: "sliding", Rate: 100, Period: time.Minute, Algorithm: pglimit.SlidingWindow}
	const at = int64(1_000_000_000)
	tat := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		name     string
		limits   []pglimit.Limit
		state    []int64
		was      []int64
		expires  int64
		previous *int64
		want     int
	}{
		{"gcra, new key", []pglimit.Limit{rate}, nil, nil, at + 300_000, nil, 3},
		{"gcra, from a later TAT", []pglimit.Limit{rate}, nil, nil, at + 500_000, tat(at + 300_000), 2},
		{"window, same window", []pglimit.Limit{rate, window}, []int64{at + 200_000, 0, 0, at - 5, 7, 0}, []int64{at, 0, 0, at - 5, 4, 0}, 0, nil, 3},
		{"window, a new one", []pglimit.Limit{rate, window}, []int64{at + 200_000, 0, 0, at, 2, 0}, []int64{at, 0, 0, at - 70_000_000, 40, 0}, 0, nil, 2},
		{"sliding, new key", []pglimit.Limit{sliding}, []int64{at / 60_000_000 * 60_000_000, 0, 4}, nil, 0, nil, 4},
		{"two gcra", []pglimit.Limit{rate, rate}, []int64{at + 400_000, 0, 0, at + 400_000, 0, 0}, []int64{at + 100_000, 0, 0, at + 100_000, 0, 0}, 0, nil, 3},
	} {
		r := auditRow{stmt: at - 10, at: at, state: tc.state}
		if got := unitsWritten(tc.limits, r, tc.was, tc.expires, tc.previous); got != tc.want {
			t.Errorf("%s: %d units, want %d", tc.name, got, tc.want)
		}
	}
}
