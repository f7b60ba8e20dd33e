package main

import (
	"cmp"
	"slices"
	"time"
)

// admission is one admitted decision as the client saw it, as offsets from
// the start of the run: the database decided at some instant between sent
// and received. Only differences between such offsets are used, so the
// client's and the database's clocks need the same rate, not the same
// reading.
type admission struct {
	sent, received time.Duration
}

// admissionCheck is what a run's admissions say about the promise "two
// admissions of one key are never less than the cooldown apart".
type admissionCheck struct {
	// Keys is the number of keys with at least one admission.
	Keys int `json:"keys"`
	// Admitted is the number of admissions over all keys.
	Admitted int `json:"admitted"`
	// MaxAllowed sums, over keys, the most admissions the cooldown allows
	// in the time the key's admissions span: floor(span/C)+1.
	MaxAllowed int `json:"max_allowed"`
	// OverAdmitted sums, over keys, max(0, admitted-allowed).
	OverAdmitted int `json:"over_admitted"`
	// Violations counts pairs of admissions of one key proven less than
	// the cooldown apart: by the client's timing, even the latest the first
	// and the earliest the second can have been decided are too close; by
	// the database's record, two consecutive admissions are too close.
	Violations int `json:"violations"`
	// MinGapMS is the shortest time between two admissions of one key, in
	// milliseconds (database record: exact; client: the largest it can
	// have been). Zero when no key was admitted twice.
	MinGapMS float64 `json:"min_gap_ms"`
	// MaxGapMS is the longest time between two consecutive admissions of
	// one key, in milliseconds.
	MaxGapMS float64 `json:"max_gap_ms"`
	// LostPeriods counts whole cooldown periods in which a key that was
	// admitted before and after was not admitted: a gap g between two
	// consecutive admissions loses floor(g/C)-1 periods. It means lost
	// admissions only where requests kept arriving (the hot-key scenarios).
	LostPeriods int `json:"lost_periods"`

	hasGap bool // MinGapMS holds a gap
}

// allowedAdmissions is the most admissions, pairwise at least cooldown
// apart, that fit in a span of time: floor(span/cooldown)+1.
func allowedAdmissions(span, cooldown time.Duration) int {
	if span < 0 {
		span = 0
	}
	return int(span/cooldown) + 1
}

// checkClient checks admissions observed by the client. Each admission's
// decision instant is only known to lie in [sent, received], so the check is
// conservative: it reports only what the timings prove.
func checkClient(byKey map[string][]admission, cooldown time.Duration) admissionCheck {
	var c admissionCheck
	for _, adm := range byKey {
		if len(adm) == 0 {
			continue
		}
		adm = slices.Clone(adm)
		slices.SortFunc(adm, func(a, b admission) int { return cmp.Compare(a.sent, b.sent) })
		first, last := adm[0].sent, adm[0].received
		for _, a := range adm {
			last = max(last, a.received)
		}
		c.count(len(adm), last-first, cooldown)

		for i, a := range adm {
			// Later admissions sent a cooldown or more after a cannot be
			// proven too close to it: the bound below only grows.
			for _, b := range adm[i+1:] {
				if b.sent-a.sent >= cooldown {
					break
				}
				if widest(a, b) < cooldown {
					c.Violations++
				}
			}
		}
		for i := 1; i < len(adm); i++ {
			c.minGap(widest(adm[i-1], adm[i]))
			// By the midpoints: the client cannot do better, and the gaps
			// matter only when they are whole cooldowns long.
			g := mid(adm[i]) - mid(adm[i-1])
			c.gap(g, cooldown)
		}
	}
	return c
}

// widest is the most that the decisions of a and b, with a sent first, can
// be apart.
func widest(a, b admission) time.Duration { return max(a.received, b.received) - a.sent }

func mid(a admission) time.Duration { return a.sent + (a.received-a.sent)/2 }

// checkRecord checks the admissions the database recorded, as exact times on
// the database clock (expiry times serve as well: every admission of a
// limiter adds the same cooldown).
func checkRecord(byKey map[string][]time.Time, cooldown time.Duration) admissionCheck {
	var c admissionCheck
	for _, ts := range byKey {
		if len(ts) == 0 {
			continue
		}
		ts = slices.Clone(ts)
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		c.count(len(ts), ts[len(ts)-1].Sub(ts[0]), cooldown)
		for i := 1; i < len(ts); i++ {
			g := ts[i].Sub(ts[i-1])
			if g < cooldown {
				c.Violations++
			}
			c.minGap(g)
			c.gap(g, cooldown)
		}
	}
	return c
}

func (c *admissionCheck) count(admitted int, span, cooldown time.Duration) {
	allowed := allowedAdmissions(span, cooldown)
	c.Keys++
	c.Admitted += admitted
	c.MaxAllowed += allowed
	c.OverAdmitted += max(0, admitted-allowed)
}

func (c *admissionCheck) minGap(g time.Duration) {
	if !c.hasGap || ms(g) < c.MinGapMS {
		c.MinGapMS, c.hasGap = ms(g), true
	}
}

func (c *admissionCheck) gap(g, cooldown time.Duration) {
	c.MaxGapMS = max(c.MaxGapMS, ms(g))
	if lost := int(g/cooldown) - 1; lost > 0 {
		c.LostPeriods += lost
	}
}

// ok reports whether the check found no over-admission of any kind.
func (c *admissionCheck) ok() bool { return c.OverAdmitted == 0 && c.Violations == 0 }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
