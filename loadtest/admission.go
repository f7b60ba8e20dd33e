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
// admissions of one key are never less than the cooldown apart" and, for a
// hot key, about liveness.
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

	// Liveness, for a hot key that requests kept reaching (see hotKey):
	// MaxGapMS is the longest stretch of the run without an admission, and
	// LostPeriods counts the admissions the cooldown would have allowed in
	// such stretches but that did not happen: a gap g between two
	// admissions loses floor(g/C)-1, the stretch before the first
	// floor(lead/C), the stretch after the last floor(trail/C).
	MaxGapMS    float64 `json:"max_gap_ms,omitempty"`
	LostPeriods int     `json:"lost_periods,omitempty"`

	// For general limits (limitcheck.go): Headroom is, per limit, the
	// fewest admissions by which any interval stayed below the limit's
	// bound (0: some interval reached it); SlackMaxMS is the widest bracket
	// of an admission's decision instant in the database's record;
	// Malformed lists states that break what the algorithms keep.
	Headroom   map[string]int `json:"headroom,omitempty"`
	SlackMaxMS float64        `json:"slack_max_ms,omitempty"`
	Malformed  []string       `json:"malformed,omitempty"`

	hasGap bool // MinGapMS holds a gap
}

// hotKey is the run's start and end on the clock of the admissions, for a
// scenario in which one key was requested all the time: then any cooldown
// period without an admission is a lost one.
type hotKey struct{ start, end time.Duration }

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
// conservative: it reports only what the timings prove. For liveness it
// takes the midpoints: the client cannot do better, and gaps matter there
// only when they are whole cooldowns long.
func checkClient(byKey map[string][]admission, cooldown time.Duration, hot *hotKey) admissionCheck {
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

		mids := make([]time.Duration, len(adm))
		for i, a := range adm {
			mids[i] = a.sent + (a.received-a.sent)/2
			if i > 0 {
				c.minGap(widest(adm[i-1], a))
			}
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
		c.liveness(mids, cooldown, hot)
	}
	if c.Keys == 0 {
		c.liveness(nil, cooldown, hot)
	}
	return c
}

// widest is the most that the decisions of a and b, with a sent first, can
// be apart.
func widest(a, b admission) time.Duration { return max(a.received, b.received) - a.sent }

// checkRecord checks the admissions the database recorded, as exact
// instants on the database clock, given as offsets from the run's start.
func checkRecord(byKey map[string][]time.Duration, cooldown time.Duration, hot *hotKey) admissionCheck {
	var c admissionCheck
	for _, ts := range byKey {
		if len(ts) == 0 {
			continue
		}
		ts = slices.Clone(ts)
		slices.Sort(ts)
		c.count(len(ts), ts[len(ts)-1]-ts[0], cooldown)
		for i := 1; i < len(ts); i++ {
			g := ts[i] - ts[i-1]
			if g < cooldown {
				c.Violations++
			}
			c.minGap(g)
		}
		c.liveness(ts, cooldown, hot)
	}
	if c.Keys == 0 {
		c.liveness(nil, cooldown, hot)
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

// liveness adds one key's stretches without admission (ts sorted) to the
// liveness figures; only for a hot key.
func (c *admissionCheck) liveness(ts []time.Duration, cooldown time.Duration, hot *hotKey) {
	if hot == nil {
		return
	}
	stretch := func(d time.Duration, lost int) {
		c.MaxGapMS = max(c.MaxGapMS, ms(d))
		c.LostPeriods += max(lost, 0)
	}
	if len(ts) == 0 {
		// Nobody admitted all run long: every chance was lost.
		stretch(hot.end-hot.start, int((hot.end-hot.start)/cooldown)+1)
		return
	}
	stretch(ts[0]-hot.start, int((ts[0]-hot.start)/cooldown))
	for i := 1; i < len(ts); i++ {
		g := ts[i] - ts[i-1]
		stretch(g, int(g/cooldown)-1)
	}
	last := ts[len(ts)-1]
	stretch(hot.end-last, int((hot.end-last)/cooldown))
}

// ok reports whether the check found no over-admission of any kind.
func (c *admissionCheck) ok() bool { return c.OverAdmitted == 0 && c.Violations == 0 }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
