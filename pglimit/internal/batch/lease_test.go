package batch

import (
	"math/rand/v2"
	"testing"
	"time"
)

// Which limits lease, and the lease's bounds, from T and Burst*T alone.
func TestNewLeases(t *testing.T) {
	for _, c := range []struct {
		name              string
		t, burstT         int64 // µs
		leases            bool
		max, reach, quiet int64 // units, µs, µs
	}{
		{name: "10,000/s, burst 100", t: 100, burstT: 10_000, leases: true, max: 25, reach: 2_500, quiet: 5_000},
		{name: "1,000/s, burst 1,000", t: 1_000, burstT: 1_000_000, leases: true, max: 250, reach: maxReach, quiet: 500_000},
		{name: "a huge burst is capped", t: 10, burstT: 10 * 100_000, leases: true, max: maxLeaseUnits, reach: maxReach, quiet: 500_000},
		{name: "burst 4: a unit", t: 100, burstT: 400, leases: true, max: 1, reach: 100, quiet: 200},
		{name: "burst 3: none", t: 100, burstT: 300},
		{name: "slower than 1,000/s: none", t: 1_001, burstT: 1_001_000},
	} {
		t.Run(c.name, func(t *testing.T) {
			ls := newLeases(c.t, c.burstT)
			if got := ls != nil; got != c.leases || Leases(c.t, c.burstT) != c.leases {
				t.Fatalf("leases: %t, want %t", got, c.leases)
			}
			if ls == nil {
				return
			}
			if ls.max != c.max || ls.reach != c.reach || ls.quiet() != time.Duration(c.quiet)*time.Microsecond {
				t.Errorf("max %d, reach %d µs, quiet %s; want %d, %d µs, %d µs", ls.max, ls.reach, ls.quiet(), c.max, c.reach, c.quiet)
			}
		})
	}
}

// A key's lease is sized by its demand: none for a key no call met a
// statement of, then the units its demand uses in the horizon, doubled
// while calls meet statements and none expire, at most a quarter of the
// burst; none while statements take more than half of Burst*T.
func TestLeaseSize(t *testing.T) {
	const T, burstT = 100, 40_000 // 10,000/s, burst 400: at most 100 units; a horizon of 2,500 µs at first
	base := time.Unix(1_000, 0)
	for _, c := range []struct {
		name         string
		rtt          int64 // µs
		used, met    int64
		expired      int64
		since        time.Duration // since the last lease was asked for; 0: never asked
		last         int64         // its size
		units, ahead int64         // what want returns
		size         int64         // the size kept; 0: no state kept
	}{
		{name: "no demand: no lease, and no state", since: time.Millisecond},
		{name: "first: calls met a statement", met: 3, units: 1, ahead: burstT / 4, size: 1},
		{name: "a unit per 100 µs: the horizon's 25", used: 10, since: time.Millisecond, units: 25, ahead: burstT / 4, size: 25},
		{name: "demand beyond the cap", used: 1_000, since: time.Millisecond, units: 100, ahead: burstT / 4, size: 100},
		{name: "doubled while busy and nothing expired", used: 1, met: 1, since: 10 * time.Millisecond, last: 40, units: 80, ahead: burstT / 4, size: 80},
		{name: "not doubled once units expired", used: 1, met: 1, expired: 5, since: 10 * time.Millisecond, last: 40},
		{name: "slow statements date it further ahead", rtt: 15_000, used: 10, since: time.Millisecond, units: 100, ahead: burstT / 2, size: 100},
		{name: "statements slower than half the burst: none taken", rtt: 20_001, used: 10, since: time.Millisecond, size: 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			ls := newLeases(T, burstT)
			ls.rtt = c.rtt
			if c.used+c.met+c.last > 0 {
				le := &lease{used: c.used, met: c.met, expired: c.expired, busy: c.met > 0, size: c.last}
				if c.since > 0 {
					le.asked = base
				}
				ls.keys["k"] = le
			}
			units, ahead := ls.want("k", base.Add(c.since))
			if units != c.units || ahead != c.ahead {
				t.Fatalf("want: %d units %d µs ahead; want %d, %d", units, ahead, c.units, c.ahead)
			}
			switch le := ls.keys["k"]; {
			case le == nil && c.size != 0:
				t.Fatalf("no state kept, want size %d", c.size)
			case le != nil && le.size != c.size:
				t.Fatalf("size %d kept, want %d", le.size, c.size)
			}
		})
	}
}

// Every unit a lease hands out is handed out inside its slot's range on
// the database clock, mapped onto the local one conservatively: unit j of
// a run leased from TAT start, by a statement sent at s, answered at r,
// that read the database clock at t0, goes no earlier than
// r + start + (j+1)T - Burst*T - t0 and no later than s + start + jT - t0.
// Units are handed out in order, each at most once, and a unit past its
// deadline is dropped, never handed out.
func TestLeaseUnitsStayInTheirSlots(t *testing.T) {
	const T, burstT = 100, 10_000
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		ls := newLeases(T, burstT)
		ls.keys["k"] = &lease{}
		s := time.Unix(1_000, 0)
		rtt := time.Duration(rng.IntN(3_000)) * time.Microsecond
		r := s.Add(rtt)
		t0 := int64(5_000_000) + rng.Int64N(rtt.Microseconds()+1) // read between s and r
		k := 1 + rng.Int64N(ls.max)
		// The statement ensures start >= t0 and start + k*T <= t0 +
		// Burst*T + reach.
		start := t0 + rng.Int64N(burstT+ls.reach-k*T+1)
		f := found{sent: s, t0: t0, row: start + k*T, leased: k, start: start}
		if ls.add("k", f, r) == nil {
			t.Fatalf("round %d: a lease of %d units added nothing", round, k)
		}
		ready := func(j int64) time.Time {
			return r.Add(time.Duration(start+(j+1)*T-burstT-t0) * time.Microsecond)
		}
		deadline := func(j int64) time.Time { return s.Add(time.Duration(start+j*T-t0) * time.Microsecond) }
		next := int64(0) // the model's next unit
		for L := r; next < k; L = L.Add(time.Duration(rng.IntN(3*T)) * time.Microsecond) {
			for next < k && deadline(next).Before(L) {
				next++ // expired
			}
			at, left, wait, ok := ls.take("k", 1, L)
			switch {
			case next == k:
				if ok {
					t.Fatalf("round %d: a unit handed out at %s after every deadline", round, L.Sub(r))
				}
			case ok:
				if L.Before(ready(next)) || L.After(deadline(next)) {
					t.Fatalf("round %d: unit %d handed out at %s, outside [%s, %s]", round, next, L.Sub(r), ready(next).Sub(r), deadline(next).Sub(r))
				}
				if want := t0 + L.Sub(s).Microseconds(); at != want {
					t.Fatalf("round %d: handed out at database time %d, want the upper estimate %d", round, at, want)
				}
				next++
				if left != k-next {
					t.Fatalf("round %d: %d units left, want %d", round, left, k-next)
				}
			case !L.Before(ready(next)):
				t.Fatalf("round %d: unit %d refused at %s, usable from %s to %s", round, next, L.Sub(r), ready(next).Sub(r), deadline(next).Sub(r))
			case wait != ready(next).Sub(L):
				t.Fatalf("round %d: refused with wait %s, want %s", round, wait, ready(next).Sub(L))
			}
		}
	}
}

// A key's row has no room by what its last statement read when its TAT
// then stands more than Burst*T - nT ahead of the latest database time now
// can be.
func TestLeaseFull(t *testing.T) {
	const T, burstT = 100, 1_000
	ls := newLeases(T, burstT)
	s := time.Unix(1_000, 0)
	ls.keys["k"] = &lease{end: 10_900, t0: 10_000, sent: s}
	for _, c := range []struct {
		after time.Duration
		n     int
		full  bool
	}{
		{after: 0, n: 1, full: false}, // 10,900 <= 10,000 + 1,000 - 100
		{after: 0, n: 2, full: true},  // 10,900 > 10,000 + 1,000 - 200
		{after: 100 * time.Microsecond, n: 2, full: false},
		{after: 99 * time.Microsecond, n: 2, full: true},
	} {
		end, at, full := ls.full("k", c.n, s.Add(c.after))
		if full != c.full || end != 10_900 || at != 10_000+c.after.Microseconds() {
			t.Errorf("%s later, %d units: full %t (end %d, at %d), want %t", c.after, c.n, full, end, at, c.full)
		}
	}
	if _, _, full := ls.full("other", 1, s); full {
		t.Error("a key without a lease is full")
	}
}

// An idle lease gives back its last run only while the row is as that
// run's statement left it; a run given back moves the row's TAT back, a
// run the row refused returns to the lease in slot order, and a run whose
// fate is unknown is lost.
func TestLeaseGiveBack(t *testing.T) {
	const T, burstT = 100, 10_000 // quiet after 5 ms; the runs' first deadlines are 8 and 9 ms after s
	s := time.Unix(1_000, 0)
	setup := func() (*leases, *lease) {
		ls := newLeases(T, burstT)
		le := &lease{}
		ls.keys["k"] = le
		ls.add("k", found{sent: s, t0: 1_000_000, row: 1_009_000, leased: 10, start: 1_008_000, xid: 7}, s)
		ls.add("k", found{sent: s, t0: 1_000_000, row: 1_011_000, leased: 20, start: 1_009_000, xid: 8}, s)
		le.last = s
		return ls, le
	}
	ls, le := setup()
	if again, tail := ls.idle("k", le, s.Add(ls.quiet()/2), false); again == 0 || tail.left != 0 {
		t.Fatalf("a lease half quiet gives back %d units, looks again in %s; want none, later", tail.left, again)
	}
	if again, tail := ls.idle("k", le, s.Add(ls.quiet()), true); again == 0 || tail.left != 0 {
		t.Fatalf("a lease whose key is deciding gives back %d units, looks again in %s; want none, later", tail.left, again)
	}
	_, tail := ls.idle("k", le, s.Add(ls.quiet()), false)
	if tail.left != 20 || tail.xid != 8 || len(le.runs) != 1 {
		t.Fatalf("tail %+v, %d runs left; want the last run's 20 units of xid 8, one run left", tail, len(le.runs))
	}
	ls.given("k", le, tail, true, false)
	if le.end != 1_011_000-20*T {
		t.Errorf("after a give-back the row's TAT is %d, want %d", le.end, 1_011_000-20*T)
	}

	ls, le = setup()
	_, tail = ls.idle("k", le, s.Add(ls.quiet()), false)
	ls.given("k", le, tail, false, true)
	if len(le.runs) != 2 || le.runs[1].end != 1_011_000 {
		t.Errorf("a refused give-back: runs %+v, want the tail back last", le.runs)
	}

	ls, le = setup()
	_, tail = ls.idle("k", le, s.Add(ls.quiet()), false)
	ls.given("k", le, tail, false, false)
	if len(le.runs) != 1 || le.expired != 20 {
		t.Errorf("a give-back of unknown fate: %d runs, %d expired; want 1, 20", len(le.runs), le.expired)
	}

	ls, le = setup()
	le.end = 1_012_000 // another statement moved the row on
	if _, tail := ls.idle("k", le, s.Add(ls.quiet()), false); tail.left != 0 {
		t.Errorf("gave back %d units of a row that moved on", tail.left)
	}
}

// Lease state outlives a key's last call by leaseIdle, and no longer,
// unless it holds units, a give-back is pending or the key is deciding.
func TestLeaseSweep(t *testing.T) {
	ls := newLeases(100, 10_000)
	now := time.Unix(1_000, 0)
	ls.met("idle", now)
	ls.met("recent", now.Add(leaseIdle/2))
	ls.met("deciding", now)
	ls.met("timer", now)
	ls.keys["timer"].timer = time.NewTimer(time.Hour)
	defer ls.keys["timer"].timer.Stop()
	left := ls.sweep(now.Add(leaseIdle), func(key string) bool { return key == "deciding" })
	if !left {
		t.Fatal("sweep reports no state left")
	}
	for key, want := range map[string]bool{"idle": false, "recent": true, "deciding": true, "timer": true} {
		if _, kept := ls.keys[key]; kept != want {
			t.Errorf("%s kept: %t, want %t", key, kept, want)
		}
	}
}
