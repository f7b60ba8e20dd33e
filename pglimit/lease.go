package pglimit

import "time"

// Leases let a busy key of a high-rate limit be admitted without a round
// trip per call. The batcher's statement for the key takes, beside its
// callers' units, up to a lease's worth more, exactly as AllowN would: the
// key's TAT moves past them. This process then hands those units out
// locally, each only while the database clock is inside the range its
// slot allows, so that every admission, leased or not, is one the
// database could have made at that instant.
//
// The rule. Every admitted unit i holds a slot of the key's schedule: the
// TAT just after it, tat_i. Slots are disjoint (each is T wide, as the
// row's TAT only moves forward past them), and a unit admitted at instant
// a_i satisfies tat_i - Burst*T <= a_i <= tat_i - T. Then any window of
// width w, [s, s+w], sees at most Burst + w/T admissions: each of its
// admissions has tat_i in [s+T, s+w+Burst*T], and there are at most
// (w + Burst*T - T)/T + 1 disjoint T-wide slots there. The database's own
// admissions satisfy both bounds (tat_i = max(TAT, now) + T). A lease of k
// units from tat = start satisfies the lower bound for all of them when
// start + k*T <= now + Burst*T at the statement's clock reading, which the
// statement ensures; the upper bound, start + j*T for unit j, is the
// deadline by which unit j must be handed out.
//
// The database clock is read once per statement, at t0, between the local
// instants s (sent) and r (answered). A unit handed out at local time L
// was handed out at database time no later than t0 + (L - s), so unit j is
// handed out only while L <= s + (start + j*T - t0): a round trip of each
// unit's range is lost rather than risk a unit late. The lower bound needs
// nothing: L >= r, so the database time is past t0.
//
// Unit j's deadline is start + j*T, so an idle key's units expire at the
// limit's own rate. The statement dates a lease ahead (start >= t0 +
// ahead), so that its units stay usable while this process's demand uses
// them; the slots it skips to do so were unused, and are lost. The lease's
// size follows this process's demand for the key: none at first, so that
// a key called by one caller at a time decides exactly as without leases;
// it doubles when callers of the key meet a statement on its way or use a
// lease up, and halves when units expire unused. The next lease is asked
// for, together with whatever else gathers, when a lease falls to half its
// size, so that a busy key's callers do not wait for the database.
//
// A Reset forgets the key's lease in this process at once, and in the
// others through the Invalidator (Config.Invalidator). Without one, a
// lease taken before another instance's Reset keeps handing out its units
// after it, until their deadlines: at most the lease's units, within
// Burst*T of the Reset.

// leaseMaxInterval is the slowest limit that leases: one unit per
// millisecond, 1,000 a second. A slower key is served well by statements
// (same-key merging shares one among its callers) and decides exactly as
// without leases.
const leaseMaxInterval = 1000 // µs

// leaseHorizon is the longest a lease is sized to last.
const leaseHorizon = 10 * 1000 // µs

// maxLeaseUnits bounds a lease whatever the burst.
const maxLeaseUnits = 4096

// leases is a batcher's lease state, by key. It is guarded by the
// batcher's mutex.
type leases struct {
	t, burstT int64 // µs
	unit      time.Duration
	max       int64 // units: at most half the burst, so that two instances both hold leases
	rtt       int64 // µs: how long the last statement that leased took
	keys      map[string]*lease
}

// newLeases returns the lease state of a single GCRA limit of emission
// interval t and span burstT (µs), or nil when it does not lease: a lease
// of more than one unit never fits, or the limit is slower than
// leaseMaxInterval.
func newLeases(t, burstT int64) *leases {
	units := min(burstT/t/2, maxLeaseUnits)
	if t > leaseMaxInterval || units < 1 {
		return nil
	}
	return &leases{t: t, burstT: burstT, unit: time.Duration(t) * time.Microsecond, max: units, keys: make(map[string]*lease)}
}

// leases reports whether a limiter of c leases: a single GCRA limit on
// Upsert or NoWait for which newLeases returns leases.
func (c *Config) leases() bool {
	if c.Strategy == Range || len(c.Limits) != 1 || c.Limits[0].Algorithm != GCRA {
		return false
	}
	_, _, t, burstT := c.Limits[0].micros()
	return newLeases(t, burstT) != nil
}

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
	met           int64 // calls that met a statement of the key, since then
	asked         time.Time
	refilling     bool // an entry of the key asks for units
}

// run is units of one statement: left of them, the next one due by
// deadline (local time) and each one after T later; at and dbAt map local
// time onto the database clock, conservatively late.
type run struct {
	left     int64
	deadline time.Time
	sent     time.Time // local: the statement was sent
	t0       int64     // database µs the statement read
}

// take hands out n units of key's lease at now, or reports false, having
// dropped the units whose deadline has passed. It returns the database
// time, an upper estimate, at which the first of them was handed out, and
// the units left.
func (ls *leases) take(key string, n int, now time.Time) (at int64, left int64, ok bool) {
	le := ls.keys[key]
	if le == nil {
		return 0, 0, false
	}
	left = le.expire(now, ls.unit)
	if left < int64(n) {
		return 0, left, false
	}
	at = le.runs[0].t0 + now.Sub(le.runs[0].sent).Microseconds()
	for need := int64(n); need > 0; {
		r := &le.runs[0]
		k := min(need, r.left)
		r.left -= k
		r.deadline = r.deadline.Add(time.Duration(k) * ls.unit)
		need -= k
		if r.left == 0 {
			le.runs = le.runs[1:]
		}
	}
	le.used += int64(n)
	return at, left - int64(n), true
}

// expire drops the units whose deadline is before now and returns the
// units left.
func (le *lease) expire(now time.Time, unit time.Duration) (left int64) {
	live := le.runs[:0]
	for _, r := range le.runs {
		if late := now.Sub(r.deadline); late > 0 {
			gone := min(int64((late+unit-1)/unit), r.left)
			r.left -= gone
			r.deadline = r.deadline.Add(time.Duration(gone) * unit)
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
// its way: demand that one statement at a time does not keep up with.
func (ls *leases) met(key string) {
	le := ls.keys[key]
	if le == nil {
		le = &lease{}
		ls.keys[key] = le
	}
	le.busy = true
	le.met++
}

// want is how many units the next statement on key asks for beside its
// calls, and how far ahead of its clock reading they start (µs). It is
// called once for each statement of the key that gathers.
//
// The lease is sized to last a horizon (a quarter of the burst's span, at
// most leaseHorizon) at this process's demand since the last one: the
// units it used and the calls that met a statement. It at least doubles
// while the last one ran out with none expired and calls still met
// statements, up to half the burst. It is dated ahead by a round trip, and
// by as long beyond T a unit as the demand takes to use it.
func (ls *leases) want(key string, now time.Time) (units, ahead int64) {
	le := ls.keys[key]
	if le == nil {
		return 0, 0
	}
	var per float64 // µs between units demanded
	if elapsed := now.Sub(le.asked).Microseconds(); !le.asked.IsZero() && le.used+le.met > 0 {
		per = float64(elapsed) / float64(le.used+le.met)
	}
	horizon := min(ls.burstT/4, leaseHorizon)
	size := int64(0)
	if per > 0 {
		size = int64(float64(horizon) / per)
	}
	if le.expired == 0 && (le.busy || le.size > 0 && le.used >= le.size) {
		size = max(size, 2*le.size, 1)
	}
	le.size = min(size, ls.max)
	if le.size == 0 {
		delete(ls.keys, key)
		return 0, 0
	}
	ahead = ls.rtt
	if per > float64(ls.t) {
		ahead += int64(float64(le.size) * (per - float64(ls.t)))
	}
	ahead = min(ahead, ls.burstT/2)
	le.used, le.met, le.expired, le.asked, le.refilling, le.busy = 0, 0, 0, now, true, false
	return le.size, ahead
}

// add gives key what a statement sent at sent and answered at now
// found: the row's TAT as it left it, row, read at t0 (µs, database clock;
// 0 when the statement did not decide the key), and the units it leased
// from TAT start.
func (ls *leases) add(key string, leased, start, row, t0 int64, sent, now time.Time) {
	le := ls.keys[key]
	if le == nil {
		return
	}
	le.refilling = false
	if t0 == 0 {
		return
	}
	ls.rtt = now.Sub(sent).Microseconds()
	le.end, le.t0, le.sent = max(le.end, row), t0, sent
	if leased > 0 {
		le.runs = append(le.runs, run{
			left:     leased,
			deadline: sent.Add(time.Duration(start-t0) * time.Microsecond),
			sent:     sent,
			t0:       t0,
		})
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

// low reports whether key's lease should be refilled now: it leases, holds
// no more than half its size, and no statement is asking for units.
func (ls *leases) low(key string, left int64) bool {
	le := ls.keys[key]
	return le != nil && !le.refilling && left <= le.size/2
}

// forget drops key's lease: a Reset.
func (ls *leases) forget(key string) { delete(ls.keys, key) }

// clear drops every lease: the Invalidator may have missed a Reset.
func (ls *leases) clear() { clear(ls.keys) }
