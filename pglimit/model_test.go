package pglimit_test

import (
	"cmp"
	"fmt"
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// model is a reference implementation of docs/limits.md in plain Go: the
// decisions a limiter must make for one key, given the database time of
// each, the refunds of its admissions, and the key's own limits
// (Config.Overrides). It is written from the document, not from the
// library's SQL or its arith.Evaluate, so that the conformance tests
// compare two readings of the same definition.
type model struct {
	limits []pglimit.Limit // defaults filled in
	// own are the key's limits: limits with the rates and bursts of its
	// row in pglimit_overrides, if it has one.
	own    []pglimit.Limit
	locs   []*time.Location // a calendar window's zone; nil for other limits
	states []modelState     // one per limit; all unset for a missing key
}

// modelState is one limit's stored state: GCRA a = tat; FixedWindow a =
// window start, b = count, c = window end; SlidingWindow a = window
// start, b = previous count, c = current count. Times in µs since the
// epoch.
type modelState struct {
	set     bool
	a, b, c int64
}

type modelMode int

const (
	modeAllowN modelMode = iota
	modeAtMost
	modeReserve
)

// modelDecision is a decision in the model's units (µs); Binding and
// Violated are indexes into the limits.
type modelDecision struct {
	Allowed    bool
	Granted    int
	Remaining  int
	RetryAfter int64
	ResetAfter int64
	Delay      int64
	Binding    int
	Violated   []int
	// Anchors are, for an admission, where it left each limit: a GCRA
	// limit's TAT, a window's start; Emissions each GCRA limit's T (the
	// key's own). A refund finds its units by them.
	Anchors, Emissions []int64
}

func (d modelDecision) String() string {
	return fmt.Sprintf("{Allowed:%t Granted:%d Remaining:%d RetryAfter:%dµs ResetAfter:%dµs Delay:%dµs Binding:%d Violated:%v}",
		d.Allowed, d.Granted, d.Remaining, d.RetryAfter, d.ResetAfter, d.Delay, d.Binding, d.Violated)
}

// modelLimits fills the defaults docs/limits.md gives: Burst 0 is 1 for
// GCRA, an empty name is "<Rate>-per-<Period>".
func modelLimits(limits []pglimit.Limit) []pglimit.Limit {
	out := slices.Clone(limits)
	for i := range out {
		if out[i].Algorithm == pglimit.GCRA && out[i].Burst == 0 {
			out[i].Burst = 1
		}
		if out[i].Name == "" {
			out[i].Name = fmt.Sprintf("%d-per-%s", out[i].Rate, out[i].Period)
		}
	}
	return out
}

func newModel(limits []pglimit.Limit) *model {
	l := modelLimits(limits)
	m := &model{limits: l, own: slices.Clone(l), locs: make([]*time.Location, len(l)), states: make([]modelState, len(l))}
	for i, lim := range l {
		if lim.Calendar != "" {
			zone := cmp.Or(lim.TimeZone, "UTC")
			loc, err := time.LoadLocation(zone)
			if err != nil {
				panic(fmt.Sprintf("model: zone %q: %v", zone, err))
			}
			m.locs[i] = loc
		}
	}
	return m
}

// reset clears the key's state; its own limits stay (they are another
// table's).
func (m *model) reset() { clear(m.states) }

// setOwn gives the key the rates and bursts of limits (by name), as
// SetKeyLimits does; none takes them away. A GCRA burst is cut to what
// replenishes within 366 days, as the statement cuts it.
func (m *model) setOwn(limits ...pglimit.Limit) {
	m.own = slices.Clone(m.limits)
	for _, o := range limits {
		i := slices.IndexFunc(m.own, func(l pglimit.Limit) bool { return l.Name == o.Name })
		if o.Rate > 0 {
			m.own[i].Rate = o.Rate
		}
		if m.own[i].Algorithm == pglimit.GCRA {
			if o.Burst > 0 {
				m.own[i].Burst = o.Burst
			}
			t := ceilDiv(m.own[i].Period.Microseconds(), int64(m.own[i].Rate))
			m.own[i].Burst = int(min(int64(m.own[i].Burst), (366*24*time.Hour).Microseconds()/t))
		}
	}
}

// refund gives back n units of the admission that left the limits at
// anchors, with GCRA intervals emissions, as docs/limits.md's Refunds
// section says: a GCRA limit whose TAT is still the anchor moves it back
// by n*T (and so the anchor, for the admission's next refund); a window
// still the one the admission counted in, or for a sliding window the
// previous one since, loses n from that window's count (not below 0). It
// reports which limits took them back. The row as it is stored decides,
// not the time of the refund: a window that has ended by the clock but
// not been replaced keeps its count, and no decision reads it again.
func (m *model) refund(anchors, emissions []int64, n int) []bool {
	took := make([]bool, len(m.limits))
	u := int64(n)
	for i, l := range m.limits {
		s := &m.states[i]
		if !s.set {
			continue
		}
		switch {
		case l.Algorithm == pglimit.GCRA && s.a == anchors[i]:
			s.a -= u * emissions[i]
			anchors[i] = s.a
			took[i] = true
		case l.Algorithm == pglimit.FixedWindow && s.a == anchors[i]:
			s.b = max(s.b-u, 0)
			took[i] = true
		case l.Algorithm == pglimit.SlidingWindow && s.a == anchors[i]:
			s.c = max(s.c-u, 0)
			took[i] = true
		case l.Algorithm == pglimit.SlidingWindow && s.a == anchors[i]+l.Period.Microseconds():
			s.b = max(s.b-u, 0)
			took[i] = true
		}
	}
	return took
}

// calendarWindow is the start and end of the calendar unit of l that
// holds now, in loc: the next unit starts where the calendar says, a day
// of 23 or 25 hours when the clocks change.
func calendarWindow(l pglimit.Limit, loc *time.Location, now int64) (start, end int64) {
	t := time.UnixMicro(now).In(loc)
	y, mo, d := t.Date()
	var s, e time.Time
	switch l.Calendar {
	case "minute":
		s = time.Date(y, mo, d, t.Hour(), t.Minute(), 0, 0, loc)
		e = s.Add(time.Minute)
	case "hour":
		s = time.Date(y, mo, d, t.Hour(), 0, 0, 0, loc)
		e = time.Date(y, mo, d, t.Hour()+1, 0, 0, 0, loc)
	case "day":
		s, e = time.Date(y, mo, d, 0, 0, 0, 0, loc), time.Date(y, mo, d+1, 0, 0, 0, 0, loc)
	case "week": // ISO: from Monday
		back := (int(t.Weekday()) + 6) % 7
		s, e = time.Date(y, mo, d-back, 0, 0, 0, 0, loc), time.Date(y, mo, d-back+7, 0, 0, 0, 0, loc)
	case "month":
		s, e = time.Date(y, mo, 1, 0, 0, 0, 0, loc), time.Date(y, mo+1, 1, 0, 0, 0, 0, loc)
	case "year":
		s, e = time.Date(y, 1, 1, 0, 0, 0, 0, loc), time.Date(y+1, 1, 1, 0, 0, 0, 0, loc)
	default:
		panic("model: calendar " + l.Calendar)
	}
	return s.UnixMicro(), e.UnixMicro()
}

// view is one limit's state rolled forward to now, as a decision sees it.
type view struct {
	l   pglimit.Limit
	now int64
	p   int64 // Period, µs
	// GCRA
	t, bt, base int64
	// FixedWindow: ws, we (its end), c. SlidingWindow: ws = cw, prev, c.
	ws, we, prev, c int64
}

func (m *model) view(i int, now int64) view {
	l, s := m.own[i], m.states[i]
	v := view{l: l, now: now, p: l.Period.Microseconds()}
	switch l.Algorithm {
	case pglimit.GCRA:
		v.t = ceilDiv(v.p, int64(l.Rate))
		v.bt = int64(l.Burst) * v.t
		tat := now // a missing key has tat = now
		if s.set {
			tat = s.a
		}
		v.base = max(tat, now)
	case pglimit.FixedWindow:
		switch {
		case s.set && now < s.c:
			v.ws, v.we, v.c = s.a, s.c, s.b
		case l.Calendar != "":
			v.ws, v.we = calendarWindow(l, m.locs[i], now)
		default:
			v.ws, v.we = now, now+v.p
		}
	case pglimit.SlidingWindow:
		cw := floorDiv(now, v.p) * v.p
		v.ws = cw
		switch {
		case s.set && s.a == cw:
			v.prev, v.c = s.b, s.c
		case s.set && s.a == cw-v.p:
			v.prev, v.c = s.c, 0
		default:
			v.prev, v.c = 0, 0
		}
	}
	return v
}

// weight is ceil(prev * (Period - e) / Period), the previous window's
// count as the sliding window still covers it, rounded up.
func (v view) weightCeil() int64 {
	e := v.now - v.ws
	return mulDivCeil(v.prev, v.p-e, v.p)
}

// admits reports whether the limit admits n units (within maxDelay for
// reserve).
func (v view) admits(n int64, mode modelMode, maxDelay int64) bool {
	switch v.l.Algorithm {
	case pglimit.GCRA:
		if mode == modeReserve {
			return v.base+n*v.t-v.now <= v.bt+maxDelay
		}
		return v.base+n*v.t-v.now <= v.bt
	case pglimit.FixedWindow:
		return v.c+n <= int64(v.l.Rate)
	default:
		e := v.now - v.ws
		rate := int64(v.l.Rate)
		// p * (Period - e) <= (Rate - c - n) * Period, exactly.
		return v.c+n <= rate && mulCmp(v.prev, v.p-e, rate-v.c-n, v.p) <= 0
	}
}

// retryAfter is the limit's wait for n units it refuses.
func (v view) retryAfter(n int64, mode modelMode, maxDelay int64) int64 {
	switch v.l.Algorithm {
	case pglimit.GCRA:
		w := v.base + n*v.t - v.now - v.bt
		if mode == modeReserve {
			w -= maxDelay
		}
		return w
	case pglimit.FixedWindow:
		return v.we - v.now
	default:
		e := v.now - v.ws
		rate := int64(v.l.Rate)
		if v.c+n <= rate {
			return v.p - mulDivFloor(rate-v.c-n, v.p, v.prev) - e
		}
		return v.p - e + v.p - mulDivFloor(rate-n, v.p, v.c)
	}
}

// atMost is how many of n units the limit would grant now.
func (v view) atMost(n int64) int64 {
	switch v.l.Algorithm {
	case pglimit.GCRA:
		return min(n, floorDiv(v.now+v.bt-v.base, v.t))
	case pglimit.FixedWindow:
		return min(n, int64(v.l.Rate)-v.c)
	default:
		return min(n, v.remaining())
	}
}

// advance counts n admitted units.
func (v *view) advance(n int64) {
	switch v.l.Algorithm {
	case pglimit.GCRA:
		v.base += n * v.t // base is now the new tat, and max(tat, now)
	default:
		v.c += n
	}
}

// remaining is what the limit has left, on the view's state.
func (v view) remaining() int64 {
	switch v.l.Algorithm {
	case pglimit.GCRA:
		return max(floorDiv(v.now+v.bt-v.base, v.t), 0)
	case pglimit.FixedWindow:
		return int64(v.l.Rate) - v.c
	default:
		return max(int64(v.l.Rate)-v.c-v.weightCeil(), 0)
	}
}

// resetAfter is the time until the limit is back to full, on the view's
// state.
func (v view) resetAfter() int64 {
	switch v.l.Algorithm {
	case pglimit.GCRA:
		return max(v.base-v.now, 0) // base >= tat, and base = tat when tat > now
	case pglimit.FixedWindow:
		if v.c == 0 {
			return 0
		}
		return v.we - v.now
	default:
		switch {
		case v.c > 0:
			return v.ws + 2*v.p - v.now
		case v.prev > 0:
			return v.ws + v.p - v.now
		}
		return 0
	}
}

func (v view) state() modelState {
	switch v.l.Algorithm {
	case pglimit.GCRA:
		return modelState{set: true, a: v.base}
	case pglimit.FixedWindow:
		return modelState{set: true, a: v.ws, b: v.c, c: v.we}
	default:
		return modelState{set: true, a: v.ws, b: v.prev, c: v.c}
	}
}

// decide returns the decision at database time now (µs since the epoch)
// for n units in mode, and applies it to the model's state if commit.
func (m *model) decide(now int64, n int, mode modelMode, maxDelay time.Duration, commit bool) modelDecision {
	views := make([]view, len(m.limits))
	for i := range views {
		views[i] = m.view(i, now)
	}
	u, md := int64(n), maxDelay.Microseconds()
	if mode == modeAtMost {
		k := u
		for _, v := range views {
			k = min(k, v.atMost(u))
		}
		if k < 1 {
			// Nothing to grant: the refusal of one unit.
			u, mode = 1, modeAllowN
		} else {
			u = k
		}
	}
	d := modelDecision{Allowed: true}
	for i, v := range views {
		if !v.admits(u, mode, md) {
			d.Allowed = false
			d.Violated = append(d.Violated, i)
		}
	}
	if !d.Allowed {
		d.RetryAfter = -1
		for _, i := range d.Violated {
			// The violated limit with the largest wait; the first on a
			// tie (docs/limits.md does not say).
			if w := views[i].retryAfter(u, mode, md); w > d.RetryAfter {
				d.RetryAfter, d.Binding = w, i
			}
		}
		d.Remaining = int(minRemaining(views))
		d.ResetAfter = views[d.Binding].resetAfter()
		return d
	}
	d.Granted = int(u)
	d.Anchors, d.Emissions = make([]int64, len(views)), make([]int64, len(views))
	for i := range views {
		if mode == modeReserve {
			v := views[i]
			d.Delay = max(d.Delay, v.base+u*v.t-v.now-v.bt)
		}
		views[i].advance(u)
		d.Anchors[i], d.Emissions[i] = views[i].ws, views[i].t
		if views[i].l.Algorithm == pglimit.GCRA {
			d.Anchors[i] = views[i].base
		}
	}
	rem := minRemaining(views)
	d.Remaining = int(rem)
	d.Binding = slices.IndexFunc(views, func(v view) bool { return v.remaining() == rem })
	d.ResetAfter = views[d.Binding].resetAfter()
	if commit {
		for i, v := range views {
			m.states[i] = v.state()
		}
	}
	return d
}

func minRemaining(views []view) int64 {
	r := views[0].remaining()
	for _, v := range views[1:] {
		r = min(r, v.remaining())
	}
	return r
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

func ceilDiv(a, b int64) int64 { return -floorDiv(-a, b) }

// mulDivFloor is floor(a*b/c) without overflow.
func mulDivFloor(a, b, c int64) int64 {
	var x, r big.Int
	x.Mul(big.NewInt(a), big.NewInt(b))
	q, _ := x.DivMod(&x, big.NewInt(c), &r) // Euclidean: floor for c > 0
	return q.Int64()
}

func mulDivCeil(a, b, c int64) int64 { return -mulDivFloor(-a, b, c) }

// mulCmp compares a*b with c*d without overflow.
func mulCmp(a, b, c, d int64) int {
	var x, y big.Int
	x.Mul(big.NewInt(a), big.NewInt(b))
	y.Mul(big.NewInt(c), big.NewInt(d))
	return x.Cmp(&y)
}

// The model on its own: small cases worked out by hand from
// docs/limits.md.
func TestModel(t *testing.T) {
	t.Parallel()
	const s = int64(1_000_000) // a second in µs
	base := 1_700_000_000 * s  // a whole number of seconds since the epoch
	type step struct {
		at      int64 // µs after base
		n       int
		mode    modelMode
		delay   time.Duration
		want    modelDecision
		noApply bool // a Peek
	}
	gcra := pglimit.Limit{Rate: 2, Period: time.Second, Burst: 3} // T = 500ms
	fixed := pglimit.Limit{Rate: 3, Period: time.Second, Algorithm: pglimit.FixedWindow}
	sliding := pglimit.Limit{Rate: 4, Period: time.Second, Algorithm: pglimit.SlidingWindow}
	for _, tt := range []struct {
		name   string
		limits []pglimit.Limit
		steps  []step
	}{
		{"gcra burst then rate", []pglimit.Limit{gcra}, []step{
			{at: 0, n: 2, want: modelDecision{Allowed: true, Granted: 2, Remaining: 1, ResetAfter: s}},
			{at: 0, n: 2, want: modelDecision{RetryAfter: s / 2, Remaining: 1, ResetAfter: s, Violated: []int{0}}},
			{at: 0, n: 1, noApply: true, want: modelDecision{Allowed: true, Granted: 1, Remaining: 0, ResetAfter: 3 * s / 2}},
			{at: 0, n: 1, want: modelDecision{Allowed: true, Granted: 1, Remaining: 0, ResetAfter: 3 * s / 2}},
			{at: 1, n: 1, want: modelDecision{RetryAfter: s/2 - 1, Remaining: 0, ResetAfter: 3*s/2 - 1, Violated: []int{0}}},
			{at: s / 2, n: 1, want: modelDecision{Allowed: true, Granted: 1, Remaining: 0, ResetAfter: 3 * s / 2}},
			{at: s/2 + 1, n: 5, mode: modeAtMost, want: modelDecision{RetryAfter: s/2 - 1, Remaining: 0, ResetAfter: 3*s/2 - 1, Violated: []int{0}}},
			{at: 5 * s, n: 5, mode: modeAtMost, want: modelDecision{Allowed: true, Granted: 3, Remaining: 0, ResetAfter: 3 * s / 2}},
		}},
		{"gcra reserve", []pglimit.Limit{gcra}, []step{
			{at: 0, n: 3, mode: modeReserve, want: modelDecision{Allowed: true, Granted: 3, Remaining: 0, ResetAfter: 3 * s / 2}},
			{at: 0, n: 2, mode: modeReserve, delay: time.Second, want: modelDecision{Allowed: true, Granted: 2, Remaining: 0, ResetAfter: 5 * s / 2, Delay: s}},
			{at: s / 4, n: 1, mode: modeReserve, delay: time.Second, want: modelDecision{RetryAfter: s / 4, Remaining: 0, ResetAfter: 9 * s / 4, Violated: []int{0}}},
			{at: s / 4, n: 1, want: modelDecision{RetryAfter: 5 * s / 4, Remaining: 0, ResetAfter: 9 * s / 4, Violated: []int{0}}},
		}},
		{"gcra period rounds up", []pglimit.Limit{{Rate: 3, Period: 10 * time.Microsecond * 1000}}, []step{ // T = ceil(10000/3) = 3334
			{at: 0, n: 1, want: modelDecision{Allowed: true, Granted: 1, Remaining: 0, ResetAfter: 3334}},
			{at: 3333, n: 1, want: modelDecision{RetryAfter: 1, Remaining: 0, ResetAfter: 1, Violated: []int{0}}},
		}},
		{"fixed window from the first request", []pglimit.Limit{fixed}, []step{
			{at: s / 2, n: 2, want: modelDecision{Allowed: true, Granted: 2, Remaining: 1, ResetAfter: s}},
			{at: s, n: 2, want: modelDecision{RetryAfter: s / 2, Remaining: 1, ResetAfter: s / 2, Violated: []int{0}}},
			{at: s, n: 4, mode: modeAtMost, want: modelDecision{Allowed: true, Granted: 1, Remaining: 0, ResetAfter: s / 2}},
			{at: 3*s/2 - 1, n: 1, want: modelDecision{RetryAfter: 1, Remaining: 0, ResetAfter: 1, Violated: []int{0}}},
			{at: 3 * s / 2, n: 1, noApply: true, want: modelDecision{Allowed: true, Granted: 1, Remaining: 2, ResetAfter: s}},
			{at: 2 * s, n: 3, want: modelDecision{Allowed: true, Granted: 3, Remaining: 0, ResetAfter: s}},
		}},
		{"sliding window weighs the previous window", []pglimit.Limit{sliding}, []step{
			{at: s / 2, n: 4, want: modelDecision{Allowed: true, Granted: 4, Remaining: 0, ResetAfter: 3 * s / 2}},
			// Next window, e = s/4: est = 4 * 3/4 = 3; one unit left.
			{at: s + s/4, n: 2, want: modelDecision{RetryAfter: s / 4, Remaining: 1, ResetAfter: 3 * s / 4, Violated: []int{0}}},
			{at: s + s/4, n: 1, want: modelDecision{Allowed: true, Granted: 1, Remaining: 0, ResetAfter: 7 * s / 4}},
			// c = 1, p = 4, e = s/4 + 1: 4 units need the next window,
			// where p' = 1: Period - e + Period - floor(0 * Period / 1).
			{at: s + s/4 + 1, n: 4, want: modelDecision{RetryAfter: 7*s/4 - 1, Remaining: 0, ResetAfter: 7*s/4 - 1, Violated: []int{0}}},
			{at: 2 * s, n: 9, mode: modeAtMost, want: modelDecision{Allowed: true, Granted: 3, Remaining: 0, ResetAfter: 2 * s}},
		}},
		{"several limits bind and refuse together", []pglimit.Limit{gcra, fixed}, []step{
			{at: 0, n: 3, want: modelDecision{Allowed: true, Granted: 3, Remaining: 0, ResetAfter: 3 * s / 2}},
			// GCRA waits 500ms for a unit, the window 1s: both refuse, the
			// window binds.
			{at: 0, n: 1, want: modelDecision{RetryAfter: s, Remaining: 0, ResetAfter: s, Binding: 1, Violated: []int{0, 1}}},
			{at: s / 2, n: 1, want: modelDecision{RetryAfter: s / 2, Remaining: 0, ResetAfter: s / 2, Binding: 1, Violated: []int{1}}},
			// GCRA has one unit left (tat 2s), the new window two: GCRA binds.
			{at: s, n: 1, want: modelDecision{Allowed: true, Granted: 1, Remaining: 1, ResetAfter: s}},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := newModel(tt.limits)
			for i, st := range tt.steps {
				got := m.decide(base+st.at, st.n, st.mode, st.delay, !st.noApply)
				if got.String() != st.want.String() {
					t.Fatalf("step %d: got %s, want %s", i, got, st.want)
				}
			}
		})
	}
}

func TestModelDefaults(t *testing.T) {
	t.Parallel()
	got := modelLimits([]pglimit.Limit{{Rate: 5, Period: time.Minute}, {Rate: 2, Period: time.Second, Algorithm: pglimit.FixedWindow}})
	want := []pglimit.Limit{{Name: "5-per-1m0s", Rate: 5, Period: time.Minute, Burst: 1}, {Name: "2-per-1s", Rate: 2, Period: time.Second, Algorithm: pglimit.FixedWindow}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// The model's refunds, worked out by hand from docs/limits.md's Refunds
// section.
func TestModelRefund(t *testing.T) {
	t.Parallel()
	const s = int64(1_000_000)
	base := 1_700_000_000 * s
	check := func(t *testing.T, what string, got, want any) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: got %v, want %v", what, got, want)
		}
	}
	t.Run("gcra gives back only the last admission's units", func(t *testing.T) {
		t.Parallel()
		m := newModel([]pglimit.Limit{{Rate: 2, Period: time.Second, Burst: 3}}) // T = 500ms
		a := m.decide(base, 2, modeAllowN, 0, true)                              // tat = base + 1s
		b := m.decide(base, 1, modeAllowN, 0, true)                              // tat = base + 1.5s
		check(t, "refund of A while B stands", m.refund(a.Anchors, a.Emissions, 1), []bool{false})
		check(t, "refund of B", m.refund(b.Anchors, b.Emissions, 1), []bool{true})
		check(t, "refund of A after B's", m.refund(a.Anchors, a.Emissions, 1), []bool{true})
		check(t, "A's anchor", a.Anchors[0]-base, s/2)
		// tat = base + 500ms: two units fit the burst again, not three.
		check(t, "AllowN(2)", m.decide(base, 2, modeAllowN, 0, false).Allowed, true)
		check(t, "AllowN(3)", m.decide(base, 3, modeAllowN, 0, false).Allowed, false)
	})
	t.Run("fixed window within the window it counted in", func(t *testing.T) {
		t.Parallel()
		m := newModel([]pglimit.Limit{{Rate: 3, Period: time.Second, Algorithm: pglimit.FixedWindow}})
		a := m.decide(base, 2, modeAllowN, 0, true)
		check(t, "refund", m.refund(a.Anchors, a.Emissions, 1), []bool{true})
		check(t, "AllowN(2) after it", m.decide(base+1, 2, modeAllowN, 0, true).Allowed, true)
		check(t, "AllowN(1) on a full window", m.decide(base+2, 1, modeAllowN, 0, false).Allowed, false)
		// A new window, and a refund of the old window's units takes
		// nothing from it.
		c := m.decide(base+s, 3, modeAllowN, 0, true)
		check(t, "refund into the old window", m.refund(a.Anchors, a.Emissions, 1), []bool{false})
		check(t, "AllowN(1) on the new window", m.decide(base+s+1, 1, modeAllowN, 0, false).Allowed, false)
		check(t, "more than the count", m.refund(c.Anchors, c.Emissions, 5), []bool{true})
		check(t, "Remaining", m.decide(base+s+2, 1, modeAllowN, 0, false).Remaining, 2)
	})
	t.Run("sliding window, current or previous", func(t *testing.T) {
		t.Parallel()
		m := newModel([]pglimit.Limit{{Rate: 4, Period: time.Second, Algorithm: pglimit.SlidingWindow}})
		a := m.decide(base+s/2, 4, modeAllowN, 0, true)
		// The next window, e = s/4: est = 4 * 3/4 = 3, no room for two.
		check(t, "AllowN(2)", m.decide(base+s+s/4, 2, modeAllowN, 0, false).Allowed, false)
		check(t, "refund into the previous window", m.refund(a.Anchors, a.Emissions, 2), []bool{true})
		// est = 2 * 3/4 = 1.5: two fit.
		check(t, "AllowN(2) after it", m.decide(base+s+s/4, 2, modeAllowN, 0, true).Allowed, true)
		check(t, "refund into the previous window, under a newer count", m.refund(a.Anchors, a.Emissions, 1), []bool{true})
		check(t, "after two windows", m.decide(base+3*s, 4, modeAllowN, 0, false).Allowed, true)
	})
	t.Run("several limits each by its own rule", func(t *testing.T) {
		t.Parallel()
		m := newModel([]pglimit.Limit{
			{Name: "g", Rate: 10, Period: time.Second, Burst: 5},
			{Name: "f", Rate: 5, Period: time.Hour, Algorithm: pglimit.FixedWindow},
		})
		a := m.decide(base, 1, modeAllowN, 0, true)
		m.decide(base, 1, modeAllowN, 0, true)
		check(t, "refund of A", m.refund(a.Anchors, a.Emissions, 1), []bool{false, true})
		check(t, "Remaining", m.decide(base, 1, modeAllowN, 0, false).Remaining, 2) // g: 5 - 2 - 1
	})
	t.Run("reset", func(t *testing.T) {
		t.Parallel()
		m := newModel([]pglimit.Limit{{Rate: 2, Period: time.Second, Burst: 2}})
		a := m.decide(base, 1, modeAllowN, 0, true)
		m.reset()
		check(t, "refund after a reset", m.refund(a.Anchors, a.Emissions, 1), []bool{false})
	})
}

// The model's calendar windows and per-key limits.
func TestModelCalendarAndOwnLimits(t *testing.T) {
	t.Parallel()
	const s = int64(1_000_000)
	base := 1_700_000_000 * s // 2023-11-14 22:13:20 UTC
	for _, tt := range []struct {
		unit, zone       string
		retry, nextStart int64 // after base
	}{
		{"minute", "", 40*s - 1, 40 * s},
		{"hour", "UTC", 46*60*s + 40*s - 1, 46*60*s + 40*s},
		{"hour", "Asia/Kolkata", 16*60*s + 40*s - 1, 16*60*s + 40*s},                          // 03:43:20 IST; the hour ends at 22:30 UTC
		{"day", "America/St_Johns", 5*3600*s + 16*60*s + 40*s - 1, 5*3600*s + 16*60*s + 40*s}, // 18:43:20 NST; midnight is 03:30 UTC
	} {
		t.Run(tt.unit+" "+tt.zone, func(t *testing.T) {
			t.Parallel()
			m := newModel([]pglimit.Limit{{Rate: 2, Period: time.Minute, Algorithm: pglimit.FixedWindow, Calendar: tt.unit, TimeZone: tt.zone}})
			if d := m.decide(base, 2, modeAllowN, 0, true); !d.Allowed {
				t.Fatalf("first: %s", d)
			}
			if d := m.decide(base+1, 1, modeAllowN, 0, true); d.Allowed || d.RetryAfter != tt.retry || d.ResetAfter != tt.retry {
				t.Errorf("in the window: %s, want a refusal with RetryAfter and ResetAfter %dµs", d, tt.retry)
			}
			if d := m.decide(base+tt.nextStart-1, 1, modeAllowN, 0, true); d.Allowed {
				t.Errorf("at the window's last µs: %s, want a refusal", d)
			}
			if d := m.decide(base+tt.nextStart, 2, modeAllowN, 0, true); !d.Allowed {
				t.Errorf("at the next window's start: %s, want an admission", d)
			}
		})
	}
	t.Run("own limits", func(t *testing.T) {
		t.Parallel()
		m := newModel([]pglimit.Limit{{Name: "g", Rate: 1, Period: time.Second, Burst: 3}, {Name: "f", Rate: 5, Period: time.Hour, Algorithm: pglimit.FixedWindow}})
		m.decide(base, 3, modeAllowN, 0, true) // tat = base + 3s
		// The burst raised to 5: the TAT carries over, two more fit.
		m.setOwn(pglimit.Limit{Name: "g", Burst: 5})
		d := m.decide(base, 2, modeAllowN, 0, true)
		if !d.Allowed || d.Remaining != 0 || d.Anchors[0] != base+5*s || d.Emissions[0] != s {
			t.Errorf("after raising the burst: %s, anchors %v", d, d.Anchors)
		}
		// The window's rate lowered to 4: 5 counted, none left.
		m.setOwn(pglimit.Limit{Name: "g", Burst: 10}, pglimit.Limit{Name: "f", Rate: 4})
		if d := m.decide(base, 1, modeAllowN, 0, false); d.Allowed || slices.Compare(d.Violated, []int{1}) != 0 || m.own[1].Rate != 4 {
			t.Errorf("after lowering the window's rate: %s", d)
		}
		// Taken away: the limiter's own limits again.
		m.setOwn()
		if !slices.Equal(m.own, m.limits) {
			t.Errorf("own limits %+v, want %+v", m.own, m.limits)
		}
	})
}
