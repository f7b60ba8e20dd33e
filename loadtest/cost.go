package main

import (
	"fmt"
	"io"
	"slices"
)

// Cost targets: a decision under one GCRA limit (with a burst) and under
// three limits in one row, against the same strategy's cooldown decision
// on the same workload.
var costTargets = map[string]float64{setGCRA: 1.1, setThree: 1.2}

// costFigure compares a limit variant's decisions with its strategy's
// cooldown on one workload (a cost-* scenario) at one concurrency.
//
// The figure is the ratio of mean decision time: the client's time from
// sending a decision to its answer, averaged over every decision of every
// round (rounds pooled, each weighted by its decisions). The mean, not a
// percentile, because it is what the decisions cost in total: time × count.
// With a fixed number of closed-loop workers the two are the same measure
// (Little's law: decisions/s = workers / mean time), so RateRatio, the
// cooldown's decisions/s over the variant's, cross-checks it; they differ
// by the load generator's own time between decisions.
type costFigure struct {
	Workload    string    `json:"workload"`
	Concurrency int       `json:"concurrency"`
	Strategy    string    `json:"strategy"`
	Variant     string    `json:"variant"`
	Limits      string    `json:"limits"`
	Rounds      int       `json:"rounds"`
	MeanMS      float64   `json:"mean_ms"`
	BaseMeanMS  float64   `json:"cooldown_mean_ms"`
	Ratio       float64   `json:"mean_time_ratio"`
	RateRatio   float64   `json:"rate_ratio"`
	RoundRatios []float64 `json:"round_mean_time_ratios"`
	Target      float64   `json:"target"`
	Met         bool      `json:"met"`
}

// costFigures returns the cost figures of a cost-* scenario's results.
func costFigures(s *scenarioReport) []costFigure {
	type pooled struct {
		decisions, timeMS, seconds float64
		rounds                     map[int]float64 // mean ms by round
	}
	type at struct {
		level   int
		variant string
	}
	sums := map[at]*pooled{}
	var levels []int
	for _, r := range s.Results {
		k := at{r.Concurrency, r.Variant}
		p := sums[k]
		if p == nil {
			p = &pooled{rounds: map[int]float64{}}
			sums[k] = p
		}
		if !slices.Contains(levels, r.Concurrency) {
			levels = append(levels, r.Concurrency)
		}
		p.decisions += float64(r.Decisions)
		p.timeMS += r.Latency.Mean * float64(r.Decisions)
		p.seconds += r.DurationS
		p.rounds[r.Round] = r.Latency.Mean
	}
	var out []costFigure
	for _, level := range levels {
		for _, v := range limitVariants() {
			p, b := sums[at{level, v.Name}], sums[at{level, string(v.Strategy)}]
			if v.Limits == "" || p == nil || b == nil || p.decisions == 0 || b.decisions == 0 {
				continue
			}
			f := costFigure{
				Workload:    s.Name,
				Concurrency: level,
				Strategy:    string(v.Strategy),
				Variant:     v.Name,
				Limits:      v.Limits,
				Rounds:      len(p.rounds),
				MeanMS:      p.timeMS / p.decisions,
				BaseMeanMS:  b.timeMS / b.decisions,
				RateRatio:   (b.decisions / b.seconds) / (p.decisions / p.seconds),
				Target:      costTargets[v.Limits],
			}
			f.Ratio = f.MeanMS / f.BaseMeanMS
			f.Met = f.Ratio <= f.Target
			for round := range len(p.rounds) + 1 {
				if m, ok := p.rounds[round]; ok && b.rounds[round] > 0 {
					f.RoundRatios = append(f.RoundRatios, m/b.rounds[round])
				}
			}
			out = append(out, f)
		}
	}
	return out
}

func isCostScenario(name string) bool { return name == scCostKeys || name == scCostHot }

// writeCostTable writes the cost figures as Markdown.
func writeCostTable(w io.Writer, costs []costFigure) {
	fmt.Fprint(w, "## Cost of general limits\n\n"+
		"Mean decision time of each limit variant over its strategy's cooldown, same run, same workload, the variants "+
		"taking turns (rounds pooled, weighted by decisions; per round in brackets). The mean because it is what the "+
		"decisions cost in total; with fixed closed-loop workers it is the inverse of decisions/s (Little's law), "+
		"shown beside it as a cross-check. Targets: one GCRA limit ≤ 1.1×, three limits in one row ≤ 1.2× the "+
		"cooldown. Timing on a shared machine: reported, never a failure.\n\n")
	fmt.Fprintln(w, "| workload | conc | variant | mean ms | cooldown mean ms | × cooldown (mean time) | per round | × (decisions/s) | target | met |")
	fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|---|---:|---:|---|")
	for _, f := range costs {
		fmt.Fprintf(w, "| %s | %d | %s | %.3f | %.3f | %.3f | %s | %.3f | ≤ %.1f | %s |\n", f.Workload, f.Concurrency, f.Variant,
			f.MeanMS, f.BaseMeanMS, f.Ratio, roundRatios(f.RoundRatios), f.RateRatio, f.Target, yesNo(f.Met))
	}
	fmt.Fprintln(w)
}

func roundRatios(rs []float64) string {
	s := "["
	for i, r := range rs {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%.2f", r)
	}
	return s + "]"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
