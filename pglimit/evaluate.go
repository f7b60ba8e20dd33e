package pglimit

import (
	"math"
	"math/bits"
)

// evaluation is a general decision's figures (see Decision), in units and
// µs.
type evaluation struct {
	allowed             bool
	granted, remaining  int64
	retry, reset, delay int64
	binding             int    // index of the binding limit
	violated            uint16 // bit i: limit i refused
	// anchors are, for an admission, where it left each limit: a GCRA
	// limit's TAT, a window's start. A refund finds its units by them.
	anchors []int64
}

// evaluate decides a request of n units (mode: modeAllow, modeAtMost or
// modeReserve within maxDelay µs) on a key's row as a statement saw it at
// now (µs since the epoch): its state column and its expires_at in µs
// (both nil for a key with no row). It is the definition of docs/limits.md,
// the same as the general statement's (decision in general.go), which
// decides in the database; evaluate
// computes what the statement does not return (remaining units, waits,
// the binding limit) from the state it decided on, and decides Peek.
func evaluate(limits []Limit, state []int64, tat *int64, now, n int64, mode int, maxDelay int64) evaluation {
	k := len(limits)
	single := k == 1 && limits[0].Algorithm == GCRA
	fresh := len(state) != 3*k
	type rolled struct{ a, b, c, cap int64 }
	st := make([]rolled, k)

	// Each limit's state rolled forward to now, and the units it admits.
	for i, l := range limits {
		P, R, T, BT := l.micros()
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
			case l.Calendar != "" && !fresh && now < state[3*i+2]:
				s.a, s.b, s.c = state[3*i], state[3*i+1], state[3*i+2]
			case l.Calendar != "":
				s.a, s.c = l.window(now)
			case !fresh && now < state[3*i]+P:
				s.a, s.b, s.c = state[3*i], state[3*i+1], state[3*i]+P
			}
			s.cap = R - s.b
		case SlidingWindow:
			s.a = now / P * P
			switch {
			case !fresh && state[3*i] == s.a:
				s.b, s.c = state[3*i+1], state[3*i+2]
			case !fresh && state[3*i] == s.a-P:
				s.b = state[3*i+2]
			}
			s.cap = max(R-s.c-ceilMulDiv(s.b, P-(now-s.a), P), 0)
		}
	}

	u := n
	if mode == modeAtMost {
		for _, s := range st {
			u = min(u, s.cap)
		}
		u = max(u, 1) // nothing to grant: the refusal is for one unit
	}

	// Whether each limit admits u units, and if not, how long until it
	// would: the refusal's wait is the longest, its limit the binding one.
	e := evaluation{allowed: true, retry: -1}
	for i, l := range limits {
		P, R, T, BT := l.micros()
		s := st[i]
		ok := u <= s.cap
		var w int64
		switch l.Algorithm {
		case GCRA:
			w = s.a + u*T - now - BT // how far past the burst u units reach
			if mode == modeReserve {
				ok = w <= maxDelay
				w -= maxDelay
			}
		case FixedWindow:
			w = s.c - now
		case SlidingWindow:
			elapsed := now - s.a
			switch {
			case ok:
			case s.c+u <= R: // the previous window's weight (b > 0) must fall
				w = P - floorMulDiv(R-s.c-u, P, s.b) - elapsed
			default: // the next window, where this one's count (c > 0) weighs
				w = 2*P - elapsed - floorMulDiv(R-u, P, s.c)
			}
		}
		if !ok {
			e.allowed = false
			e.violated |= 1 << i
			if w > e.retry {
				e.retry, e.binding = w, i
			}
		}
	}
	if e.allowed {
		e.granted, e.retry = u, 0
	}

	// What remains after the grant (none for a refusal), and when each
	// limit is back to full; admitted, the binding limit is the one with
	// the fewest units left.
	g := e.granted
	if e.allowed {
		e.anchors = make([]int64, k)
	}
	for i, l := range limits {
		P, R, T, BT := l.micros()
		s := st[i]
		if e.allowed {
			e.anchors[i] = s.a
			if l.Algorithm == GCRA {
				e.anchors[i] = s.a + g*T
			}
		}
		var r, rs int64
		switch l.Algorithm {
		case GCRA:
			after := s.a + g*T
			r, rs = max((now+BT-after)/T, 0), max(after-now, 0)
			if e.allowed {
				e.delay = max(e.delay, s.a+u*T-now-BT)
			}
		case FixedWindow:
			b := s.b + g
			r = R - b
			if b > 0 {
				rs = s.c - now
			}
		case SlidingWindow:
			c := s.c + g
			r = max(R-c-ceilMulDiv(s.b, P-(now-s.a), P), 0)
			switch {
			case c > 0:
				rs = s.a + 2*P - now
			case s.b > 0:
				rs = s.a + P - now
			}
		}
		if i == 0 || r < e.remaining {
			e.remaining = r
			if e.allowed {
				e.binding, e.reset = i, rs
			}
		}
		if !e.allowed && i == e.binding {
			e.reset = rs
		}
	}
	return e
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

// mulDiv is x·y/z and its remainder. The arguments evaluate passes bound
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
