package batch

import (
	"slices"
	"time"
)

// leaseMaxInterval is the slowest limit that leases: one unit per
// millisecond, 1,000 a second. A slower key is served well by statements
// (same-key merging shares one among its callers) and decides exactly as
// without leases.
const leaseMaxInterval = 1000 // µs

// maxReach is the farthest a lease reaches past the burst.
const maxReach = 10 * 1000 // µs

// maxLeaseUnits bounds a lease whatever the burst.
const maxLeaseUnits = 4096

// leases is a Group's lease state, by key. It is guarded by the
// Group's mutex.
type leases struct {
	t, burstT int64 // µs
	unit      time.Duration
	max       int64 // units: a quarter of the burst
	rtt       int64 // µs: how long statements that lease take, a moving average
	reach     int64 // µs: how far past the burst a lease reaches, its later units usable later
	keys      map[string]*lease
}

// newLeases returns the lease state of a single GCRA limit of emission
// interval t and span burstT (µs), or nil when it does not lease: its
// burst is less than 4 (a lease could not hold a unit), or the limit is
// slower than leaseMaxInterval.
func newLeases(t, burstT int64) *leases {
	units := min(burstT/t/4, maxLeaseUnits)
	if t > leaseMaxInterval || units < 1 {
		return nil
	}
	return &leases{
		t: t, burstT: burstT, unit: time.Duration(t) * time.Microsecond, max: units,
		reach: min(burstT/4, maxReach), keys: make(map[string]*lease),
	}
}

// Leases reports whether a single GCRA limit of emission interval t and
// span burstT (µs) leases: its burst is 4 or more, and it admits a unit a
// millisecond or faster.
func Leases(t, burstT int64) bool { return newLeases(t, burstT) != nil }

// lease is one key's: the runs of units this process holds, in the order
// they are handed out, and how the next one is sized.
type lease struct {
	runs []run
	size int64 // units the next statement on the key asks for beside its calls
	end  int64 // µs, database clock: the key's TAT as the last statement left it
	t0   int64 // µs, database clock: when that statement read it, sent at sent
	sent time.Time
	busy bool // a call of the key met a statement of it gathering or on its way

	used, expired int64 // units since the last statement asked for a lease
	met           int64 // calls that met a statement of the key, or were refused here, since then
	asked         time.Time

	last  time.Time   // a call of the key came to the lease
	timer *time.Timer // to give the lease's tail back once idle (Group.giveBack), if armed
}

// run is units of one statement: left of them, the next one usable from
// ready until deadline (local times), each one after it T later; sent and
// t0 map local time onto the database clock, conservatively late. The
// units left are the last slots before end, the TAT the statement wrote
// in transaction xid.
type run struct {
	left            int64
	ready, deadline time.Time
	sent            time.Time // local: the statement was sent
	t0              int64     // database µs the statement read
	end, xid        int64
}

// take hands out n units of key's lease at now, or reports false, having
// dropped the units whose deadline has passed. It returns the database
// time, an upper estimate, at which they were handed out, and the units
// left; or, when the lease holds n units but the last of them is not
// usable yet, how long until it is.
func (ls *leases) take(key string, n int, now time.Time) (at, left int64, wait time.Duration, ok bool) {
	le := ls.keys[key]
	if le == nil {
		return 0, 0, 0, false
	}
	le.last = now
	left = le.expire(now, ls.unit)
	if left < int64(n) {
		return 0, left, 0, false
	}
	// The n-th unit is the last to become usable.
	need := int64(n)
	for _, r := range le.runs {
		if need <= r.left {
			if ready := r.ready.Add(time.Duration(need-1) * ls.unit); ready.After(now) {
				return 0, left, ready.Sub(now), false
			}
			break
		}
		need -= r.left
	}
	at = le.runs[0].t0 + now.Sub(le.runs[0].sent).Microseconds()
	for need := int64(n); need > 0; {
		r := &le.runs[0]
		k := min(need, r.left)
		r.advance(k, ls.unit)
		need -= k
		if r.left == 0 {
			le.runs = le.runs[1:]
		}
	}
	le.used += int64(n)
	return at, left - int64(n), 0, true
}

// advance drops the run's next k units.
func (r *run) advance(k int64, unit time.Duration) {
	r.left -= k
	r.ready = r.ready.Add(time.Duration(k) * unit)
	r.deadline = r.deadline.Add(time.Duration(k) * unit)
}

// expire drops the units whose deadline is before now and returns the
// units left.
func (le *lease) expire(now time.Time, unit time.Duration) (left int64) {
	live := le.runs[:0]
	for _, r := range le.runs {
		if late := now.Sub(r.deadline); late > 0 {
			gone := min(int64((late+unit-1)/unit), r.left)
			r.advance(gone, unit)
			le.expired += gone
		}
		if r.left > 0 {
			live = append(live, r)
			left += r.left
		}
	}
	clear(le.runs[len(live):])
	le.runs = live
	return left
}

// met notes that a call of key met a statement of the key gathering or on
// its way, at now: demand that one statement at a time does not keep up
// with.
func (ls *leases) met(key string, now time.Time) {
	le := ls.keys[key]
	if le == nil {
		le = &lease{}
		ls.keys[key] = le
	}
	le.busy = true
	le.met++
	le.last = now
}

// leaseIdle is how long a key's lease state outlives the key's last call
// once it holds no units: what a sweep of the Group drops. It bounds the
// memory of keys that no longer come (docs/operations.md, "Bounds every
// call keeps").
const leaseIdle = time.Second

// sweep drops the lease state of keys idle at now: no unit left, no
// give-back pending, no statement of the key gathering or on its way
// (busy reports that), and no call for leaseIdle. Their demand is then
// forgotten, as a key's is after a pause in any case. It reports whether
// any state is left.
func (ls *leases) sweep(now time.Time, busy func(key string) bool) bool {
	dropped := 0
	for key, le := range ls.keys {
		if le.timer == nil && now.Sub(le.last) >= leaseIdle && !busy(key) && le.expire(now, ls.unit) == 0 {
			delete(ls.keys, key)
			dropped++
		}
	}
	if dropped > len(ls.keys) {
		// A map keeps the size it grew to: the survivors move to one of
		// their own size.
		keys := make(map[string]*lease, len(ls.keys))
		for key, le := range ls.keys {
			keys[key] = le
		}
		ls.keys = keys
	}
	return len(ls.keys) > 0
}

// want is how many units the next statement on key asks for beside its
// calls, and how far ahead of its clock reading they start (µs), as the
// package's doc says. It is called once for each
// statement of the key that gathers.
func (ls *leases) want(key string, now time.Time) (units, ahead int64) {
	le := ls.keys[key]
	if le == nil {
		return 0, 0
	}
	var per float64 // µs between units demanded
	if elapsed := now.Sub(le.asked).Microseconds(); !le.asked.IsZero() && le.used+le.met > 0 {
		per = float64(elapsed) / float64(le.used+le.met)
	}
	var size int64
	if per > 0 {
		size = int64(float64(ls.horizon()) / per)
	}
	if le.busy && le.expired == 0 {
		// Calls met a statement, and no unit went unused: more than the
		// lease's demand, which a closed loop of callers waiting for
		// statements underestimates.
		size = max(size, 2*le.size, 1)
	}
	le.size = min(size, ls.max)
	if le.size == 0 {
		delete(ls.keys, key) // less than a unit per horizon: no lease
		return 0, 0
	}
	if ls.rtt > ls.burstT/2 {
		// Statements take so long that a lease, dated at most half the
		// burst's span ahead, would expire on its way: none, until they
		// are quicker again.
		return 0, 0
	}
	le.used, le.met, le.expired, le.asked, le.busy = 0, 0, 0, now, false
	return le.size, min(max(ls.burstT/4, 2*ls.rtt), ls.burstT/2)
}

// horizon is the span of demand a lease is sized for (µs): four round
// trips, between a sixteenth and a quarter of Burst*T.
func (ls *leases) horizon() int64 {
	return min(max(4*ls.rtt, ls.burstT/16), ls.burstT/4)
}

// quiet is how long a lease waits for a call before it gives its tail
// back: half of Burst*T.
func (ls *leases) quiet() time.Duration {
	return time.Duration(ls.burstT/2) * time.Microsecond
}

// roundTrip notes how long a statement of the Group took, sent to
// answered: a moving average of the last few.
func (ls *leases) roundTrip(d time.Duration) {
	ls.rtt += (d.Microseconds() - ls.rtt) / 4
}

// found is what a statement sent at sent found for a key: the row's TAT
// as it left it, row, read at t0 (µs, database clock; 0 when the statement
// did not decide the key) in transaction xid, and the units it leased from
// TAT start.
type found struct {
	sent                        time.Time
	t0, row, xid, leased, start int64
}

// add gives key what e, its statement answered at now, found. It returns
// the key's lease when it gained units.
func (ls *leases) add(key string, e found, now time.Time) *lease {
	le := ls.keys[key]
	if le == nil || e.t0 == 0 {
		return nil
	}
	le.end, le.t0, le.sent = max(le.end, e.row), e.t0, e.sent
	if e.leased == 0 {
		return nil
	}
	le.last = now // a horizon for its first call
	// Unit 0 is usable from the database time start + T - Burst*T, which
	// is at least t0 + (that - t0) and so, on the local clock, no earlier
	// than now + (that - t0); until start, which is no later than sent +
	// (start - t0).
	le.runs = append(le.runs, run{
		left:     e.leased,
		ready:    now.Add(time.Duration(e.start+ls.t-ls.burstT-e.t0) * time.Microsecond),
		deadline: e.sent.Add(time.Duration(e.start-e.t0) * time.Microsecond),
		sent:     e.sent,
		t0:       e.t0,
		end:      e.row,
		xid:      e.xid,
	})
	return le
}

// idle is what becomes of le, key's lease, at now, when its timer fires:
// while calls of the key come to it, or a statement of the key gathers or
// is on its way (deciding), it holds on, and again is when to look next
// (0 when it holds no units, or is no longer key's). Once no call has come
// for quiet, tail is the run of units to give back, taken out of the
// lease: the last statement's, if the row's TAT is still where that
// statement left it, by what this process has read. The caller gives it
// back, and tells given how that went.
func (ls *leases) idle(key string, le *lease, now time.Time, deciding bool) (again time.Duration, tail run) {
	if ls.keys[key] != le || le.expire(now, ls.unit) == 0 {
		return 0, run{}
	}
	wait := ls.quiet()
	if quiet := now.Sub(le.last); quiet < wait || deciding {
		return max(wait-quiet, wait/4), run{}
	}
	if last := len(le.runs) - 1; le.runs[last].end == le.end {
		tail = le.runs[last]
		le.runs[last] = run{}
		le.runs = le.runs[:last]
	}
	return 0, tail
}

// given settles tail, the run idle took out of le, key's lease, to give
// back: the row took it back (ok), or it did not change (unchanged), and
// the units are still the lease's, or what happened is not known, and they
// are lost.
func (ls *leases) given(key string, le *lease, tail run, ok, unchanged bool) {
	switch {
	case ok:
		if le.end == tail.end {
			// The row has room for them again: a call needs not be
			// refused here for want of it (full).
			le.end -= tail.left * ls.t
		}
	case unchanged && ls.keys[key] == le:
		// Back among the runs, in the order of their slots: any run added
		// meanwhile is later.
		i := slices.IndexFunc(le.runs, func(r run) bool { return r.end > tail.end })
		if i < 0 {
			i = len(le.runs)
		}
		le.runs = slices.Insert(le.runs, i, tail)
	default:
		le.expired += tail.left
	}
}

// full reports whether the key's row had no room for n units at now, by
// what the key's last statement found: its TAT then, end, exceeds the
// latest database time now can be, at, by more than the limit allows. The
// row's TAT only grows but for a Reset, which drops the lease, so such a
// call is refused without a round trip, as the database would refuse it.
func (ls *leases) full(key string, n int, now time.Time) (end, at int64, ok bool) {
	le := ls.keys[key]
	if le == nil || le.t0 == 0 {
		return 0, 0, false
	}
	at = le.t0 + now.Sub(le.sent).Microseconds()
	return le.end, at, le.end > at+ls.burstT-int64(n)*ls.t
}

// low reports whether key's lease should be refilled now: it leases and
// holds no more than half its size. (Its caller asks only while no entry of
// the key gathers or is on its way: that entry would bring units.)
func (ls *leases) low(key string, left int64) bool {
	le := ls.keys[key]
	return le != nil && left <= le.size/2
}

// forget drops key's lease: a Reset.
func (ls *leases) forget(key string) { delete(ls.keys, key) }

// clear drops every lease: the Invalidator may have missed a Reset.
func (ls *leases) clear() { clear(ls.keys) }
