package arith

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// gcra, fixed and sliding are limits of rate per period (µs).
func gcra(rate, burst, period int64) Limit {
	t := (period + rate - 1) / rate
	return Limit{Algorithm: GCRA, Period: period, Rate: rate, T: t, BurstT: burst * t}
}

func window(a Algorithm, rate, period int64) Limit {
	return Limit{Algorithm: a, Period: period, Rate: rate, T: (period + rate - 1) / rate}
}

const second = int64(1_000_000)

// Worked examples of docs/limits.md, one per algorithm, at its edges.
func TestEvaluate(t *testing.T) {
	now := int64(1_800_000_000) * second
	for _, tc := range []struct {
		name    string
		at      int64 // µs after now, a second's boundary
		limits  []Limit
		state   []int64
		tat     *int64
		n       int64
		mode    Mode
		allowed bool
		retry   int64
		remain  int64
	}{
		// A fresh key of 10/s, bursts of 5: 5 fit at once, the sixth
		// waits one emission interval.
		{"gcra burst", 0, []Limit{gcra(10, 5, second)}, nil, nil, 5, Allow, true, 0, 0},
		{"gcra past burst", 0, []Limit{gcra(10, 5, second)}, nil, nil, 6, Allow, false, second / 10, 5},
		// 3 per second, all used half a second into the window.
		{"fixed full", 0, []Limit{window(FixedWindow, 3, second)}, []int64{now - second/2, 3, 0}, nil, 1, Allow, false, second / 2, 0},
		{"fixed next window", 0, []Limit{window(FixedWindow, 3, second)}, []int64{now - second, 3, 0}, nil, 3, Allow, true, 0, 0},
		// 10 per second; the previous window's 10 weigh ⌈10·0.75⌉ = 8 a
		// quarter into this one, which leaves 2.
		{"sliding room", second / 4, []Limit{window(SlidingWindow, 10, second)}, []int64{now - second, 0, 10}, nil, 2, Allow, true, 0, 0},
		{"sliding full", second / 4, []Limit{window(SlidingWindow, 10, second)}, []int64{now - second, 0, 10}, nil, 3, Allow, false, -1, 2},
		// AtMost grants what the tightest limit has.
		{"at most", 0, []Limit{gcra(10, 5, second), window(FixedWindow, 3, second)}, nil, nil, 4, AtMost, true, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := Evaluate(tc.limits, tc.state, tc.tat, now+tc.at, tc.n, tc.mode, 0)
			if e.Allowed != tc.allowed {
				t.Fatalf("allowed %t, want %t (%+v)", e.Allowed, tc.allowed, e)
			}
			if tc.retry >= 0 && e.Retry != tc.retry {
				t.Errorf("retry %d µs, want %d", e.Retry, tc.retry)
			}
			if !e.Allowed && e.Remaining != tc.remain {
				t.Errorf("remaining %d, want %d", e.Remaining, tc.remain)
			}
			if tc.mode == AtMost && e.Granted != 3 {
				t.Errorf("granted %d, want the fixed window's 3", e.Granted)
			}
		})
	}
}

// mulDiv is exact where x·y overflows 64 bits, and saturates where the
// quotient does not fit.
func TestMulDiv(t *testing.T) {
	// (2^62-1)·4 overflows; /3 is (2^64-4)/3, whose ceiling is
	// 6148914691236517204.
	if got := ceilMulDiv(math.MaxInt64/2, 4, 3); got != 6148914691236517204 {
		t.Errorf("ceilMulDiv = %d, want 6148914691236517204", got)
	}
	if got := floorMulDiv(7, 3, 2); got != 10 {
		t.Errorf("floorMulDiv(7, 3, 2) = %d, want 10", got)
	}
	if got := ceilMulDiv(7, 3, 2); got != 11 {
		t.Errorf("ceilMulDiv(7, 3, 2) = %d, want 11", got)
	}
	if got := floorMulDiv(math.MaxInt64, math.MaxInt64, 1); got != math.MaxInt64 {
		t.Errorf("an overflowing quotient = %d, want it saturated", got)
	}
	if got := floorMulDiv(-1, 5, 2); got != math.MaxInt64 {
		t.Errorf("a negative argument = %d, want it saturated", got)
	}
}

// A key with debt never uses more than the limit admits plus its Debt: a
// greedy caller that takes a unit whenever it may and settles at random
// with up to 3 units past each estimate. Each charged unit counts when
// settled. GCRA: at most Burst + Debt + (t1-t0)/T units in [t0, t1]; a
// sliding or calendar window: at most k*Rate + Debt in k consecutive
// windows (each window's count is at most Rate, but the debt's); a fixed
// window that starts at a request: at most (m+1)*Rate + Debt in any m
// periods, as without debt at most (m+1)*Rate. A debt forgotten at a
// window's end (not carried) would add Debt per window, and fail these.
func TestSettleRepaysDebt(t *testing.T) {
	minute := int64(60) * second
	for _, tc := range []struct {
		name  string
		limit Limit
	}{
		{"gcra", gcra(10, 4, minute)},
		{"fixed", window(FixedWindow, 10, minute)},
		{"calendar", func() Limit {
			l := window(FixedWindow, 10, minute)
			l.Calendar = &Calendar{Unit: "minute", Zone: "UTC", Loc: time.UTC}
			return l
		}()},
		{"sliding", window(SlidingWindow, 10, minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.limit
			l.Debt = 6
			limits := []Limit{l}
			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			type use struct{ at, n int64 }
			var uses []use
			var state []int64
			var tat *int64
			start := int64(1_800_000_000) * second / minute * minute
			now := start
			for range 4000 {
				now += int64(rng.IntN(int(5 * second)))
				e := Evaluate(limits, state, tat, now, 1, Allow, 0)
				if !e.Allowed {
					continue
				}
				st, exp := Admit(limits, state, tat, now, 1)
				state, tat = st, &exp
				uses = append(uses, use{now, 1})
				if rng.IntN(3) == 0 {
					st, exp, charged := Settle(limits, state, tat, now, e.Anchors, 0, 1+int64(rng.IntN(3)))
					state, tat = st, &exp
					uses = append(uses, use{now, charged})
				}
			}
			for i := range uses {
				var sum int64
				for j := i; j < len(uses); j++ {
					sum += uses[j].n
					span := uses[j].at - uses[i].at
					var most int64
					switch {
					case l.Algorithm == GCRA:
						most = l.BurstT/l.T + l.Debt + span/l.T + 1
					case l.Algorithm == SlidingWindow || l.Calendar != nil:
						k := uses[j].at/minute - uses[i].at/minute + 1
						most = k*l.Rate + l.Debt
					default:
						most = (span/l.Period+2)*l.Rate + l.Debt
					}
					if sum > most {
						t.Fatalf("%d units used from %d µs to %d µs after the start, more than %d", sum, uses[i].at-start, uses[j].at-start, most)
					}
				}
			}
			t.Logf("%d uses over %d minutes", len(uses), (now-start)/minute)
		})
	}
}

// Returned counts what a settle gives back: on the limit that takes back
// the most, nothing once no limit counts the admission, and for GCRA the
// part ahead of now in whole units, rounded up.
func TestReturned(t *testing.T) {
	minute := int64(60) * second
	start := int64(1_800_000_000) * second / minute * minute
	g, f, s := gcra(5, 5, minute), window(FixedWindow, 5, minute), window(SlidingWindow, 5, minute)
	for _, tc := range []struct {
		name   string
		limits []Limit
		after  int64 // µs after the admission of 5 at start
		back   int64
		want   int64
	}{
		{"gcra at once", []Limit{g}, 0, 4, 4},
		{"gcra half a unit left", []Limit{g}, 54 * second, 4, 1},
		{"gcra passed", []Limit{g}, minute, 4, 0},
		{"fixed, its window", []Limit{f}, minute - 1, 4, 4},
		{"fixed, the next window", []Limit{f}, minute, 4, 0},
		{"sliding, the previous window", []Limit{s}, minute, 4, 4},
		{"sliding, two windows on", []Limit{s}, 2 * minute, 4, 0},
		{"the most of two limits", []Limit{f, g}, minute, 4, 0},
		{"the most of two limits, one counting", []Limit{f, s}, minute, 4, 4},
		{"nothing to give", []Limit{f}, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := Evaluate(tc.limits, nil, nil, start, 5, Allow, 0)
			if !e.Allowed {
				t.Fatalf("the admission of 5: %+v", e)
			}
			state, tat := Admit(tc.limits, nil, nil, start, 5)
			if got := Returned(tc.limits, state, &tat, start+tc.after, e.Anchors, tc.back); got != tc.want {
				t.Errorf("Returned %d, want %d", got, tc.want)
			}
		})
	}
}
