// Package arith is the arithmetic of a decision, written twice over, and
// kept in one place: Evaluate in Go, and DecisionSQL and RefundSQL, the SQL
// the general statement and the refund run. Both compute what
// docs/limits.md defines; the model test checks each against it, and the
// PL/pgSQL copy (migration 00004's pglimit_decide) too.
package arith

import (
	"math"
	"math/bits"
)

// Algorithm numbers the algorithms as pglimit.Algorithm does.
type Algorithm int

const (
	GCRA Algorithm = iota
	FixedWindow
	SlidingWindow
)

// Limit is a limit's figures, in µs and units.
type Limit struct {
	Algorithm Algorithm
	Period    int64     // µs; a calendar window's nominal length
	Rate      int64     // units per Period
	T         int64     // the emission interval: Period/Rate, rounded up
	BurstT    int64     // Burst*T
	Calendar  *Calendar // a FixedWindow aligned to the calendar; nil otherwise
	// Debt is how many units a settle may charge past the limit (see
	// Settle): a window's count past Rate then carries into the next
	// window. 0: none, and the arithmetic is that of a limit without debt.
	Debt int64
}

// Mode is what a decision asks for.
type Mode int

const (
	Allow   Mode = iota // admit n or refuse
	AtMost              // admit up to n
	Reserve             // admit n within a maximum delay (GCRA only)
	Modes
)

// Single reports whether limits are one GCRA limit, whose state is the
// row's expires_at alone.
func Single(limits []Limit) bool { return len(limits) == 1 && limits[0].Algorithm == GCRA }

// AllGCRA reports whether every limit is GCRA, as Reserve needs.
func AllGCRA(limits []Limit) bool {
	for _, l := range limits {
		if l.Algorithm != GCRA {
			return false
		}
	}
	return true
}

// Evaluation is a decision's figures (see pglimit.Decision), in units and
// µs.
type Evaluation struct {
	Allowed             bool
	Granted, Remaining  int64
	Retry, Reset, Delay int64
	Binding             int    // index of the binding limit
	Violated            uint16 // bit i: limit i refused
	// Anchors are, for an admission, where it left each limit: a GCRA
	// limit's TAT, a window's start. A refund finds its units by them.
	Anchors []int64
}

// Evaluate decides a request of n units (mode: Allow, AtMost or Reserve
// within maxDelay µs) on a key's row as a statement saw it at
// now (µs since the epoch): its state column and its expires_at in µs
// (both nil for a key with no row). It is the definition of docs/limits.md,
// the same as the general statement's (DecisionSQL), which decides in the
// database; Evaluate
// computes what the statement does not return (remaining units, waits,
// the binding limit) from the state it decided on, and decides Peek.
func Evaluate(limits []Limit, state []int64, tat *int64, now, n int64, mode Mode, maxDelay int64) Evaluation {
	k := len(limits)
	st := roll(limits, state, tat, now)

	u := n
	if mode == AtMost {
		for _, s := range st {
			u = min(u, s.cap)
		}
		u = max(u, 1) // nothing to grant: the refusal is for one unit
	}

	// Whether each limit admits u units, and if not, how long until it
	// would: the refusal's wait is the longest, its limit the binding one.
	e := Evaluation{Allowed: true, Retry: -1}
	for i, l := range limits {
		ok, w := fits(l, st[i], u, now, mode, maxDelay)
		if !ok {
			e.Allowed = false
			e.Violated |= 1 << i
			if w > e.Retry {
				e.Retry, e.Binding = w, i
			}
		}
	}
	if e.Allowed {
		e.Granted, e.Retry = u, 0
	}

	// What remains after the grant (none for a refusal), and when each
	// limit is back to full; admitted, the binding limit is the one with
	// the fewest units left.
	g := e.Granted
	if e.Allowed {
		e.Anchors = make([]int64, k)
	}
	for i, l := range limits {
		s := st[i]
		if e.Allowed {
			e.Anchors[i] = s.a
			if l.Algorithm == GCRA {
				e.Anchors[i] = s.a + g*l.T
				e.Delay = max(e.Delay, s.a+u*l.T-now-l.BurstT)
			}
		}
		r, rs := left(l, s, g, now)
		if i == 0 || r < e.Remaining {
			e.Remaining = r
			if e.Allowed {
				e.Binding, e.Reset = i, rs
			}
		}
		if !e.Allowed && i == e.Binding {
			e.Reset = rs
		}
	}
	return e
}

// fits reports whether limit l, its state rolled to now (s), admits u
// units in mode, and if it does not, how long until it would (w, µs).
func fits(l Limit, s rolled, u, now int64, mode Mode, maxDelay int64) (ok bool, w int64) {
	P, R, T, BT := l.Period, l.Rate, l.T, l.BurstT
	ok = u <= s.cap
	switch l.Algorithm {
	case GCRA:
		w = s.a + u*T - now - BT // how far past the burst u units reach
		if mode == Reserve {
			ok = w <= maxDelay
			w -= maxDelay
		}
	case FixedWindow:
		w = s.c - now
		if u > R-carry(l, s.b) { // the next window starts in debt
			w += P
		}
	case SlidingWindow:
		elapsed := now - s.a
		// The next window's previous and current counts: this one's, or
		// in debt, Rate and what it owes past Rate.
		b, c := s.c, int64(0)
		if l.Debt > 0 {
			b, c = min(s.c, R), carry(l, s.c)
		}
		switch {
		case ok:
		case s.c+u <= R: // the previous window's weight (b > 0) must fall
			w = P - floorMulDiv(R-s.c-u, P, s.b) - elapsed
		case c+u <= R: // the next window, where this one's count (b > 0) weighs
			w = 2*P - elapsed - floorMulDiv(R-c-u, P, b)
		default: // the one after, where the debt carried (c > 0) weighs
			w = 3*P - elapsed - floorMulDiv(R-u, P, c)
		}
	}
	return ok, w
}

// carry is what a window's count past limit l's Rate carries into the
// next window: the debt a settle left, if l has any.
func carry(l Limit, count int64) int64 {
	if l.Debt == 0 {
		return 0
	}
	return max(count-l.Rate, 0)
}

// left is what limit l, its state rolled to now (s), has left once g units
// are granted (r), and how long until it is back to full (rs, µs).
func left(l Limit, s rolled, g, now int64) (r, rs int64) {
	P, R, T, BT := l.Period, l.Rate, l.T, l.BurstT
	switch l.Algorithm {
	case GCRA:
		after := s.a + g*T
		r, rs = max((now+BT-after)/T, 0), max(after-now, 0)
	case FixedWindow:
		b := s.b + g
		r = R - b // below 0 only past a key's own lower Rate: as it stands
		switch {
		case l.Debt > 0 && b > R: // in debt: full once the next window repaid it
			r, rs = 0, s.c+P-now
		case b > 0:
			rs = s.c - now
		}
	case SlidingWindow:
		c := s.c + g
		r = max(R-c-ceilMulDiv(s.b, P-(now-s.a), P), 0)
		switch {
		case l.Debt > 0 && c > R: // in debt: the next window carries it
			rs = s.a + 3*P - now
		case c > 0:
			rs = s.a + 2*P - now
		case s.b > 0:
			rs = s.a + P - now
		}
	}
	return r, rs
}

// Standing is where a limit stands on a key now, in units and µs: how many
// units it admits at once (Remaining), how long until it admits one
// (Retry; zero when it does), and how long until it is back to full
// (Reset); for a window, also the current window's end (End; zero for
// GCRA, and for a fixed window that starts at the key's next request).
type Standing struct{ Remaining, Retry, Reset, End int64 }

// Stand returns where each of limits stands on a key's row as a statement
// saw it at now (Evaluate's inputs): what a request would meet, limit by
// limit, without deciding one.
func Stand(limits []Limit, state []int64, tat *int64, now int64) []Standing {
	st := roll(limits, state, tat, now)
	out := make([]Standing, len(limits))
	for i, l := range limits {
		s := st[i]
		r, rs := left(l, s, 0, now)
		out[i] = Standing{Remaining: r, Reset: rs}
		if ok, w := fits(l, s, 1, now, Allow, 0); !ok {
			out[i].Retry = w
		}
		switch l.Algorithm {
		case FixedWindow:
			if s.b > 0 || l.Calendar != nil { // else a window starts at the next request
				out[i].End = s.c
			}
		case SlidingWindow:
			out[i].End = s.a + l.Period
		}
	}
	return out
}

// rolled is a limit's state rolled forward to now: a GCRA limit's TAT (a);
// a fixed window's start, count and end (a, b, c); a sliding window's
// start, previous and current counts (a, b, c); and the units it admits
// now (cap).
type rolled struct{ a, b, c, cap int64 }

// roll rolls each limit's state (see Evaluate) forward to now.
func roll(limits []Limit, state []int64, tat *int64, now int64) []rolled {
	single := Single(limits)
	fresh := len(state) != 3*len(limits)
	st := make([]rolled, len(limits))
	for i, l := range limits {
		P, R, T, BT := l.Period, l.Rate, l.T, l.BurstT
		s := &st[i]
		switch l.Algorithm {
		case GCRA:
			s.a = now
			switch {
			case single && tat != nil:
				s.a = max(*tat, now)
			case !single && !fresh:
				s.a = max(state[3*i], now)
			}
			s.cap = (now + BT - s.a) / T
		case FixedWindow:
			s.a, s.c = now, now+P // the window's start and end
			switch {
			case l.Calendar != nil && !fresh && now < state[3*i+2]:
				s.a, s.b, s.c = state[3*i], state[3*i+1], state[3*i+2]
			case l.Calendar != nil:
				s.a, s.c = l.Calendar.Window(now)
				if !fresh && state[3*i+2] == s.a { // the window after the row's
					s.b = carry(l, state[3*i+1])
				}
			case !fresh && now < state[3*i]+P:
				s.a, s.b, s.c = state[3*i], state[3*i+1], state[3*i]+P
			case !fresh && now < state[3*i]+2*P: // within a window of the row's
				s.b = carry(l, state[3*i+1])
			}
			s.cap = R - s.b
		case SlidingWindow:
			s.a = now / P * P
			switch {
			case !fresh && state[3*i] == s.a:
				s.b, s.c = state[3*i+1], state[3*i+2]
			case !fresh && state[3*i] == s.a-P:
				s.b, s.c = state[3*i+2], carry(l, state[3*i+2])
				s.b -= s.c
			}
			s.cap = max(R-s.c-ceilMulDiv(s.b, P-(now-s.a), P), 0)
		}
	}
	return st
}

// Admit is the row once u units are admitted at now (µs) on its state and
// expires_at (tat, in µs), as the statements write it (DecisionSQL's
// newState and newExpires): a single GCRA limit's state is nil and its TAT
// the new expires_at; otherwise the state holds every limit's, and
// expires_at is when the last of them is back to full.
func Admit(limits []Limit, state []int64, tat *int64, now, u int64) (newState []int64, expires int64) {
	st := roll(limits, state, tat, now)
	expires = now
	if !Single(limits) {
		newState = make([]int64, 0, 3*len(limits))
	}
	for i, l := range limits {
		s := st[i]
		var next [3]int64
		switch l.Algorithm {
		case GCRA:
			next[0] = s.a + u*l.T
			expires = max(expires, next[0])
		case FixedWindow:
			next = [3]int64{s.a, s.b + u, 0}
			if l.Calendar != nil {
				next[2] = s.c
			}
			expires = max(expires, s.c)
		case SlidingWindow:
			next = [3]int64{s.a, s.b, s.c + u}
			expires = max(expires, s.a+2*l.Period)
		}
		if newState != nil {
			newState = append(newState, next[:]...)
		}
	}
	return newState, expires
}

// ceilMulDiv is ⌈x·y/z⌉ for x, y >= 0 and z > 0, exact where x·y
// overflows 64 bits (a count times a period in µs). The quotient must fit.
func ceilMulDiv(x, y, z int64) int64 {
	q, r := mulDiv(x, y, z)
	if r > 0 {
		q++
	}
	return q
}

// floorMulDiv is ⌊x·y/z⌋ for x, y >= 0 and z > 0.
func floorMulDiv(x, y, z int64) int64 {
	q, _ := mulDiv(x, y, z)
	return q
}

// mulDiv is x·y/z and its remainder. The arguments Evaluate passes bound
// the quotient (see docs/limits.md); state that breaks them (edited by
// hand, say) saturates rather than panics.
func mulDiv(x, y, z int64) (q, r int64) {
	hi, lo := bits.Mul64(uint64(x), uint64(y))
	if x < 0 || y < 0 || z <= 0 || hi >= uint64(z) {
		return math.MaxInt64, 0
	}
	uq, ur := bits.Div64(hi, lo, uint64(z))
	if uq > math.MaxInt64 {
		return math.MaxInt64, 0
	}
	return int64(uq), int64(ur)
}

// Settle is the row once a settle at now (µs) gives back back units of an
// admission that left limits at anchors (Evaluation.Anchors), or charges
// charge units past it: the cost it paid for exceeded or fell short of its
// estimate, and at most one of back and charge is positive. Its inputs and
// outputs are Admit's, with charged, the units it charged.
//
// A GCRA limit gets back the part of the admission's last back units that
// lies ahead of now, and a window its count, if the admission's window
// still counts (as a refund's). The charge is the same on every limit: at
// most what each admits now plus its Debt, so that a key owes at most
// Debt units on any limit, and more is forgiven. A window that ends owing
// carries the debt into the next one (carry). SettleSQL computes the
// same in the database.
func Settle(limits []Limit, state []int64, tat *int64, now int64, anchors []int64, back, charge int64) (newState []int64, expires, charged int64) {
	st := roll(limits, state, tat, now)
	fresh := len(state) != 3*len(limits)
	charged = charge
	for i, l := range limits {
		charged = min(charged, max(settleRoom(l, st[i], now), 0))
	}
	expires = now
	if !Single(limits) {
		newState = make([]int64, 0, 3*len(limits))
	}
	for i, l := range limits {
		s, anchor := st[i], anchors[i]
		var next [3]int64
		var end int64
		switch l.Algorithm {
		case GCRA:
			g := max(min(back*l.T, anchor-now), 0)
			next[0] = s.a - g + charged*l.T
			end = next[0]
		case FixedWindow:
			b := s.b + charged
			if s.a == anchor {
				b -= min(back, s.b)
			}
			end = s.c
			next = [3]int64{s.a, b, 0}
			if l.Calendar != nil {
				next[2] = s.c
			} else if !fresh && b == 0 && now >= state[3*i]+l.Period {
				// Nothing counted in a window that has not begun: the
				// row's window stays, ended, as a decision leaves it.
				next = [3]int64{state[3*i], state[3*i+1], state[3*i+2]}
			}
			if b > l.Rate {
				end += l.Period
			}
		case SlidingWindow:
			b, c := s.b, s.c+charged
			switch anchor {
			case s.a:
				c -= min(back, s.c)
			case s.a - l.Period:
				b -= min(back, s.b)
			}
			next = [3]int64{s.a, b, c}
			end = s.a + 2*l.Period
			if c > l.Rate {
				end += l.Period
			}
		}
		expires = max(expires, end)
		if newState != nil {
			newState = append(newState, next[:]...)
		}
	}
	return newState, expires, charged
}

// Returned is how many units a settle giving back back units (Settle's
// inputs) gives back, counted on the limit that takes back the most: the
// count of a window that still counts the admission, and for GCRA the part
// of the admission's last back units that lies ahead of now, rounded up
// to whole units. It is 0 when no limit counts the admission any more.
func Returned(limits []Limit, state []int64, tat *int64, now int64, anchors []int64, back int64) int64 {
	if back <= 0 {
		return 0
	}
	st := roll(limits, state, tat, now)
	var most int64
	for i, l := range limits {
		s, anchor := st[i], anchors[i]
		var r int64
		switch l.Algorithm {
		case GCRA:
			g := max(min(back*l.T, anchor-now), 0)
			r = (g + l.T - 1) / l.T
		case FixedWindow:
			if s.a == anchor {
				r = min(back, s.b)
			}
		case SlidingWindow:
			switch anchor {
			case s.a:
				r = min(back, s.c)
			case s.a - l.Period:
				r = min(back, s.b)
			}
		}
		most = max(most, r)
	}
	return most
}

// settleRoom is how many units a settle may charge limit l, its state
// rolled to now (s): what it admits now, plus its Debt.
func settleRoom(l Limit, s rolled, now int64) int64 {
	switch l.Algorithm {
	case GCRA:
		return (now + l.BurstT + l.Debt*l.T - s.a) / l.T
	case FixedWindow:
		return l.Rate + l.Debt - s.b
	default:
		return l.Rate + l.Debt - s.c - ceilMulDiv(s.b, l.Period-(now-s.a), l.Period)
	}
}

// Owed is how many units a key owes on its worst limit, on its row as a
// statement saw it at now (Evaluate's inputs): the debt a settle left,
// not yet repaid; 0 when it owes none.
func Owed(limits []Limit, state []int64, tat *int64, now int64) int64 {
	var owed int64
	for i, s := range roll(limits, state, tat, now) {
		l := limits[i]
		switch l.Algorithm {
		case GCRA:
			if over := s.a - now - l.BurstT; over > 0 {
				owed = max(owed, (over+l.T-1)/l.T)
			}
		case FixedWindow:
			owed = max(owed, s.b-l.Rate)
		case SlidingWindow:
			owed = max(owed, s.c+ceilMulDiv(s.b, l.Period-(now-s.a), l.Period)-l.Rate)
		}
	}
	return owed
}

// GCRACost is what n units cost a single GCRA limit of emission interval
// t and span burstT (µs): the increment nT its TAT moves by, and the
// tolerance tau its TAT may stand ahead of now by for them to fit.
func GCRACost(n int, t, burstT int64) (nT, tau int64) {
	nT = int64(n) * t
	return nT, burstT - nT
}
