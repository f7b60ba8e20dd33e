package pglimit_test

import (
	"fmt"
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// model is a reference implementation of docs/limits.md in plain Go: the
// decisions a limiter must make for one key, given the database time of
// each. It is written from the document, not from the library's SQL or
// its arith.Evaluate, so that the conformance test compares two readings
// of the same definition.
type model struct {
	limits []pglimit.Limit // defaults filled in
	states []modelState    // one per limit; all unset for a missing key
}

// modelState is one limit's stored state: GCRA a = tat; FixedWindow a =
// window start, b = count; SlidingWindow a = window start, b = previous
// count, c = current count. Times in µs since the epoch.
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
	return &model{limits: l, states: make([]modelState, len(l))}
}

func (m *model) reset() { clear(m.states) }

// view is one limit's state rolled forward to now, as a decision sees it.
type view struct {
	l   pglimit.Limit
	now int64
	p   int64 // Period, µs
	// GCRA
	t, bt, base int64
	// FixedWindow: ws, c. SlidingWindow: ws = cw, prev, c.
	ws, prev, c int64
}

func (m *model) view(i int, now int64) view {
	l, s := m.limits[i], m.states[i]
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
		if !s.set || now >= s.a+v.p {
			v.ws, v.c = now, 0
		} else {
			v.ws, v.c = s.a, s.b
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
		return v.ws + v.p - v.now
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
		return v.ws + v.p - v.now
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
		return modelState{set: true, a: v.ws, b: v.c}
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
	for i := range views {
		if mode == modeReserve {
			v := views[i]
			d.Delay = max(d.Delay, v.base+u*v.t-v.now-v.bt)
		}
		views[i].advance(u)
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
