package batch

import (
	"math"
	"time"
)

// level decides how many of a Group's statements run at once: the Group's
// in-flight level. It is a hill climb on what the Group measures (the
// package's doc, "The level"). It holds no clock and no lock: the Group
// calls it with its mutex held and the time of each event.
type level struct {
	now int // statements that may run at once: in [1, most]
	// most is the bound: the connections the Group may use (pool).
	most int

	// The epoch being measured: the statements that finished in it, the
	// calls they answered and the calls' time from arrival to answer.
	began  time.Time // zero until the epoch starts
	skip   int       // statements still to finish before it starts: sent under another level
	stmts  int
	calls  int64
	waited time.Duration
	bound  bool // some call found the level reached, and gathered

	// The search.
	base     float64 // the power at now, by the last epoch that measured it
	measured bool    // base is an epoch's at now, which another may be compared with
	noise    float64 // how far apart two epochs at one level are, relative (a moving average)
	from     int     // the level a probe left; 0 while no probe runs
	seen     float64 // the power of a probe's first epoch, where it was better
	up       bool    // which way the next probe goes
	fine     int     // how fine the steps are: a factor of 2^(1/2^fine)
	tried    int     // probes at this step that found nothing better: one way, or both
	rest     int     // epochs left at the level before the next probe
	restFor  int     // epochs to rest after a probe that found nothing better

	// pool, if set, is the pool's size and its connections in use; read
	// at the end of each epoch.
	pool func() (size, busy int)
	// moved holds the level's last change until the Group reports it.
	moved struct{ from, to int }
}

// Bounds of the search, which are about statistics, not about a machine.
const (
	// epochStatements is the fewest statements an epoch counts, and
	// epochRounds the fewest rounds of the level's statements: enough
	// answers for a mean.
	epochStatements = 64
	epochRounds     = 8
	// better is the least more power a probe must show to be taken.
	better = 0.02
	// shifted is how far the power at a level may move between two of its
	// epochs before the load counts as changed and the search restarts.
	shifted = 0.25
	// fineMost is the finest step: a factor of 2^(1/4), about 1.19.
	fineMost = 2
	// restMost is the longest rest between probes, in epochs: once
	// settled, at most one epoch in restMost+1 runs at a probe level.
	restMost = 16
)

// newLevel returns a level that starts at start, within [1, most] and
// within what pool, if set, says the pool leaves the Group.
func newLevel(start, most int, pool func() (size, busy int)) *level {
	most = max(most, 1)
	// Two epochs at the start before the first probe: a first measure of
	// the noise.
	return &level{now: min(max(start, 1), most), most: most, up: true, rest: 1, pool: pool}
}

// gathered records that a call found the level reached and gathered.
func (v *level) gathered() { v.bound = true }

// finished records a statement that ended at now, having answered calls
// calls that waited waited in all, with inFlight of the Group's statements
// still running; it ends the epoch when it is long enough, and moves the
// level by what the epoch measured.
func (v *level) finished(now time.Time, calls int, waited time.Duration, inFlight int) {
	if v.skip > 0 {
		v.skip--
		return
	}
	if v.began.IsZero() {
		v.began = now
		return
	}
	v.stmts++
	v.calls += int64(calls)
	v.waited += waited
	if v.stmts < max(epochStatements, epochRounds*v.now) || v.calls == 0 || v.waited <= 0 {
		return
	}
	elapsed := now.Sub(v.began)
	if elapsed <= 0 {
		return
	}
	// Power, throughput over latency: with a fixed number of callers in a
	// closed loop it grows with throughput, with a fixed arrival rate it
	// falls with latency (Kleinrock's power).
	rate := float64(v.calls) / elapsed.Seconds()
	latency := v.waited.Seconds() / float64(v.calls)
	power := rate / latency
	bound := v.bound
	v.began, v.stmts, v.calls, v.waited, v.bound = now, 0, 0, 0, false
	if v.pool != nil {
		// Others use the connections in use past the Group's statements
		// (some of which may still wait for a connection).
		size, busy := v.pool()
		v.most = max(size-max(busy-inFlight, 0), 1)
		if v.now > v.most { // the pool has no more: a probe above it ends here
			v.from, v.seen, v.measured = 0, 0, false
			v.set(v.most, inFlight)
			return
		}
	}
	v.step(power, bound, inFlight)
}

// step moves the level by an epoch's power, and whether some call of the
// epoch found the level reached.
func (v *level) step(power float64, bound bool, inFlight int) {
	if v.from != 0 { // the epoch measured a probe
		if power > v.base*(1+v.margin()) && v.seen == 0 {
			v.seen = power // better: measure it again before taking it
			return
		}
		from, seen := v.from, v.seen
		v.from, v.seen = 0, 0
		if power > v.base*(1+v.margin()) {
			v.base, v.tried, v.restFor = (seen+power)/2, 0, 0
			v.measured = false // a probe's one epoch: no sample of the noise
			if !bound && v.up {
				v.up = false // no call waited for this level: a higher one would change nothing
				return
			}
			v.probe(inFlight) // on, the same way, as far
			return
		}
		v.up = !v.up
		if v.tried++; v.tried == 2 { // neither way pays at this step
			v.tried = 0
			if v.fine < fineMost {
				v.fine++ // a shorter step
			} else {
				v.restFor = min(max(1, 2*v.restFor), restMost) // settled: probe less often
			}
		}
		v.rest = v.restFor
		v.set(from, inFlight) // and measure it again before the next probe
		return
	}
	if v.measured {
		// Two epochs at one level: how far apart they are is the noise, or
		// the load itself moved, if much further than the noise so far.
		d := math.Abs(power-v.base) / v.base
		if d > max(shifted, 4*v.noise) {
			v.fine, v.tried, v.rest, v.restFor = 0, 0, 0, 0 // the load changed: search again, from long steps
		}
		v.noise += (d - v.noise) / 4
	}
	v.base, v.measured = power, true
	if !bound && v.up {
		v.up = false // a higher level would change nothing: no call waited for one
	}
	if v.rest > 0 {
		v.rest--
		return
	}
	v.probe(inFlight)
}

// margin is how much more power a probe must show to be taken: twice the
// noise between two epochs at one level, and at least better.
func (v *level) margin() float64 { return max(better, 2*v.noise) }

// probe moves the level one step the way the search goes, or the other
// way where that is the bound.
func (v *level) probe(inFlight int) {
	next := v.next(v.up)
	if next == v.now {
		v.up = !v.up
		if next = v.next(v.up); next == v.now {
			return
		}
	}
	v.from = v.now
	v.set(next, inFlight)
}

// next is the level one step up or down from now, within the bounds: by a
// factor of 2, or its square or fourth root once the search is finer; by
// one at least.
func (v *level) next(up bool) int {
	f := math.Pow(2, math.Pow(0.5, float64(v.fine)))
	if up {
		return min(max(int(math.Round(float64(v.now)*f)), v.now+1), v.most)
	}
	return max(min(int(math.Round(float64(v.now)/f)), v.now-1), 1)
}

// set changes the level to n; the next epoch starts once the statements
// in flight, sent under the old level, have finished.
func (v *level) set(n, inFlight int) {
	if n == v.now {
		return
	}
	if v.moved.from == 0 {
		v.moved.from = v.now
	}
	v.moved.to = n
	v.now = n
	v.began, v.stmts, v.calls, v.waited, v.bound = time.Time{}, 0, 0, 0, false
	v.skip = inFlight
}

// change returns the level's changes since the last call, from the level
// it left to the level it is at, and forgets them; 0, 0 for none.
func (v *level) change() (from, to int) {
	from, to = v.moved.from, v.moved.to
	v.moved.from, v.moved.to = 0, 0
	if from == to {
		return 0, 0
	}
	return from, to
}
