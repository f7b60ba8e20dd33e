package main

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// The checks of general limits (docs/limits.md), for the variants that
// enforce a limit set instead of a cooldown. Each limit bounds how many
// admissions of one key can be decided within any interval of length w:
//
//   - GCRA, T = ceil(Period/Rate), B = Burst: at most B + floor(w/T). (After
//     admission i the TAT is at least t_i + T, it grows by T per admission,
//     and after admission j it is at most t_j + B*T.) This is the documented
//     Burst + Rate*w/Period, exact in the integer microseconds the
//     statements use.
//   - FixedWindow and SlidingWindow: at most Rate per window, so at most
//     Rate * (floor(w/Period) + 2) in an interval that can touch that many
//     windows. The database's record is checked more tightly, window by
//     window, from the state the row holds (see checkRecordLimits).
//
// Several limits on one key hold together: every bound applies to the same
// admissions.

// emission is a GCRA limit's interval per unit, rounded up as the library
// rounds it.
func emission(l pglimit.Limit) time.Duration {
	p, r := l.Period.Microseconds(), int64(l.Rate)
	return time.Duration((p+r-1)/r) * time.Microsecond
}

// maxIn is the most admissions l allows whose decisions all lie within an
// interval of length w.
func maxIn(l pglimit.Limit, w time.Duration) int {
	w = max(w, 0)
	if l.Algorithm == pglimit.GCRA {
		return max(l.Burst, 1) + int(w/emission(l))
	}
	return l.Rate * (int(w/l.Period) + 2)
}

// pairBounds checks every run of consecutive admissions a..b of one key (in
// the order given) against every limit's maxIn, where widest(a, b) is the
// longest the interval holding their decisions can be. A run with more
// admissions than a limit allows is a proven violation; headroom records,
// per limit, the fewest admissions any run stayed below its bound.
func pairBounds(n int, widest func(a, b int) time.Duration, limits []pglimit.Limit, c *admissionCheck) {
	for b := range n {
		for a := b; a >= 0; a-- {
			k := b - a + 1
			w := widest(a, b)
			for _, l := range limits {
				bound := maxIn(l, w)
				if k > bound {
					c.Violations++
				}
				c.headroom(l.Name, bound-k)
			}
		}
	}
}

// headroom notes that a limit's bound was left room to spare by h
// admissions somewhere; the smallest is kept.
func (c *admissionCheck) headroom(name string, h int) {
	if c.Headroom == nil {
		c.Headroom = map[string]int{}
	}
	if old, ok := c.Headroom[name]; !ok || h < old {
		c.Headroom[name] = h
	}
}

// allowedIn is the most admissions the limits together allow within an
// interval of length span.
func allowedIn(limits []pglimit.Limit, span time.Duration) int {
	out := -1
	for _, l := range limits {
		if m := maxIn(l, span); out < 0 || m < out {
			out = m
		}
	}
	return out
}

// checkClientLimits checks admissions observed by the client against
// limits. As for the cooldown, each decision is only known to lie in
// [sent, received], so it reports what the timings prove.
func checkClientLimits(byKey map[string][]admission, limits []pglimit.Limit) admissionCheck {
	var c admissionCheck
	for _, adm := range byKey {
		if len(adm) == 0 {
			continue
		}
		adm = slices.Clone(adm)
		slices.SortFunc(adm, func(a, b admission) int { return cmp.Compare(a.sent, b.sent) })
		// latest[i] is the latest any of adm[:i+1] can have been decided.
		latest := make([]time.Duration, len(adm))
		for i, a := range adm {
			latest[i] = a.received
			if i > 0 {
				latest[i] = max(latest[i], latest[i-1])
			}
		}
		c.countIn(len(adm), allowedIn(limits, latest[len(adm)-1]-adm[0].sent))
		// Sorted by sent, the decisions of adm[a..b] lie in
		// [adm[a].sent, the latest receive among them]; the latest among
		// adm[:b+1] is no earlier, so the interval is a wide one.
		if len(limits) == 1 && limits[0].Algorithm == pglimit.GCRA {
			gcraBounds(adm, latest, limits[0], &c)
			continue
		}
		pairBounds(len(adm), func(a, b int) time.Duration { return latest[b] - adm[a].sent }, limits, &c)
	}
	return c
}

// gcraBounds is pairBounds for one GCRA limit, with checkClientLimits'
// intervals [adm[a].sent, latest[b]], in one pass: a busy key's hundreds of
// thousands of admissions make too many pairs. The run a..b, k = b-a+1
// admissions, exceeds B + floor(w/T) exactly when (k - B)*T > w, that is
// when (b+1)*T - latest[b] - B*T > a*T - adm[a].sent; so the smallest
// a*T - adm[a].sent so far settles every run ending at b at once, and its
// margin is the run's headroom. Violations counts the admissions b that
// end a run over the bound.
func gcraBounds(adm []admission, latest []time.Duration, l pglimit.Limit, c *admissionCheck) {
	T := emission(l)
	burstT := time.Duration(max(l.Burst, 1)) * T
	var low time.Duration
	for b, a := range adm {
		if v := time.Duration(b)*T - a.sent; b == 0 || v < low {
			low = v
		}
		excess := time.Duration(b+1)*T - latest[b] - burstT - low
		if excess > 0 {
			c.Violations++
		}
		// The run's bound minus its admissions: floor(-excess / T).
		h := -excess / T
		if -excess%T < 0 {
			h--
		}
		c.headroom(l.Name, int(h))
	}
}

// checkRecordLimits checks the admissions the audit trigger recorded
// against limits.
//
// Times: no slack is assumed for the trigger's clock read; each admission's
// decision instant is bracketed instead. It is no later than the trigger's
// clock_timestamp() (at), read after the decision in the same statement. It
// is no earlier than its statement's start (stmt), nor than the previous
// admission's at: the decision reads the clock once it holds the key's row
// lock (or, for a new key, its advisory lock), which the previous admission
// released only at its commit, after its trigger ran. A run of admissions
// a..b (by at) was thus decided within [the earliest lower bound among them,
// at_b], and that interval's length is what the GCRA bound is checked
// against. SlackMaxMS reports the widest bracket; a wide one makes the check
// more lenient, never wrong.
//
// Windows are checked exactly, from the row's state after each admission
// (three integers per limit, migrations/00004_general_limits.sql): grouped
// by the window start it records, no window admits more than Rate; fixed
// windows never overlap (consecutive starts at least Period apart) and
// sliding windows are aligned to multiples of Period.
func checkRecordLimits(byKey map[string][]auditRow, limits []pglimit.Limit) admissionCheck {
	var c admissionCheck
	us := func(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
	for _, rows := range byKey {
		if len(rows) == 0 {
			continue
		}
		rows = slices.Clone(rows)
		slices.SortFunc(rows, func(a, b auditRow) int { return cmp.Compare(a.at, b.at) })
		lo := make([]int64, len(rows)) // the earliest each can have been decided
		for i, r := range rows {
			lo[i] = r.stmt
			if i > 0 {
				lo[i] = max(lo[i], rows[i-1].at)
			}
			c.SlackMaxMS = max(c.SlackMaxMS, ms(us(r.at-lo[i])))
		}
		pairBoundsRecord(rows, lo, limits, &c)

		allowed := -1
		for i, l := range limits {
			var m int
			if l.Algorithm == pglimit.GCRA {
				m = maxIn(l, us(rows[len(rows)-1].at-slices.Min(lo)))
			} else {
				m = c.windows(rows, l, i, len(limits))
			}
			if allowed < 0 || m < allowed {
				allowed = m
			}
		}
		c.countIn(len(rows), allowed)
	}
	return c
}

// checkRecordLeases checks the writes of a single GCRA limit l that leases
// against what a write may do, with admitted the admissions the clients saw
// by key. A write takes units for the calls of its statement and a lease
// (docs/limits.md, "Leases"), so it does not pair with admissions; what
// the record proves instead:
//
//   - no write sets the TAT further past its clock than Burst*T plus the
//     lease's reach (a quarter of Burst*T, at most 10 ms): a Violation;
//   - the units the writes took are no fewer than the admissions. A write
//     took at most (new TAT - max(previous TAT, its statement's start))/T
//     units, a new key's at most (new TAT - its statement's start)/T + 0,
//     and a write that moves the TAT back gives (previous TAT - new TAT)/T
//     units back: the sum is the MaxAllowed, and admissions beyond it are
//     OverAdmitted.
func checkRecordLeases(byKey map[string][]leaseWrite, l pglimit.Limit, admitted map[string]int) admissionCheck {
	var c admissionCheck
	T := emission(l).Microseconds()
	burstT := int64(max(l.Burst, 1)) * T
	reach := min(burstT/4, 10_000)
	for key, n := range admitted {
		var took int64
		for _, w := range byKey[key] {
			if w.expires > w.at+burstT+reach {
				c.Violations++
				c.malformed(fmt.Sprintf("%s: TAT %dµs past its write's clock, more than Burst*T + reach %dµs", key, w.expires-w.at, burstT+reach))
			}
			base := w.stmt
			if w.previous != nil {
				if w.expires < *w.previous {
					took -= (*w.previous - w.expires) / T // an idle lease's units given back
					continue
				}
				base = max(base, *w.previous)
			}
			took += max(w.expires-base, 0) / T
		}
		c.countIn(n, int(took))
	}
	return c
}

// pairBoundsRecord is pairBounds on the record, for the GCRA limits, where
// the admissions rows[a..b] were decided within [min lo over a..b,
// rows[b].at].
func pairBoundsRecord(rows []auditRow, lo []int64, limits []pglimit.Limit, c *admissionCheck) {
	for b := range rows {
		from := lo[b]
		for a := b; a >= 0; a-- {
			from = min(from, lo[a])
			k := b - a + 1
			w := time.Duration(rows[b].at-from) * time.Microsecond
			for _, l := range limits {
				if l.Algorithm != pglimit.GCRA {
					continue
				}
				bound := maxIn(l, w)
				if k > bound {
					c.Violations++
				}
				c.headroom(l.Name, bound-k)
			}
		}
	}
}

// windows checks the window limit l, the i-th of n, on one key's rows
// sorted by time, from the window start each row's state records, and
// returns the most admissions the windows seen allow (Rate each).
func (c *admissionCheck) windows(rows []auditRow, l pglimit.Limit, i, n int) int {
	count := map[int64]int{}
	var starts []int64
	period := l.Period.Microseconds()
	for _, r := range rows {
		if len(r.state) != 3*n {
			c.Violations++
			c.malformed(fmt.Sprintf("state %v: want %d integers", r.state, 3*n))
			continue
		}
		ws := r.state[3*i]
		if count[ws] == 0 {
			starts = append(starts, ws)
		}
		count[ws]++
		if l.Algorithm == pglimit.SlidingWindow && ws%period != 0 {
			c.Violations++
			c.malformed(fmt.Sprintf("%s: window start %d not aligned to %s", l.Name, ws, l.Period))
		}
	}
	slices.Sort(starts)
	for j, ws := range starts {
		if count[ws] > l.Rate {
			c.Violations += count[ws] - l.Rate
		}
		c.headroom(l.Name, l.Rate-count[ws])
		if j > 0 && l.Algorithm == pglimit.FixedWindow && ws-starts[j-1] < period {
			c.Violations++
			c.malformed(fmt.Sprintf("%s: windows at %d and %d overlap", l.Name, starts[j-1], ws))
		}
	}
	return l.Rate * len(starts)
}

// countIn adds one key's admissions and the most its limits allow.
func (c *admissionCheck) countIn(admitted, allowed int) {
	c.Keys++
	c.Admitted += admitted
	c.MaxAllowed += allowed
	c.OverAdmitted += max(0, admitted-allowed)
}

// malformed notes a state that breaks what the algorithms keep; the first
// few are kept for the report.
func (c *admissionCheck) malformed(what string) {
	if len(c.Malformed) < 5 {
		c.Malformed = append(c.Malformed, what)
	}
}
