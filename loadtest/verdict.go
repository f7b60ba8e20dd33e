package main

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// writeVerdict prints what a reader wants from a run, in under 100
// columns: for every scenario and level, pglimit's default strategy and
// its fastest variant against the peer (or the floor, without the peer),
// and how many admissions pglimit made past a limit. report.md and
// results.json hold every figure.
func writeVerdict(w io.Writer, rep *report) {
	against, col := "redis_rate's (the peer, on Redis without persistence)", "× redis_rate"
	if !slices.ContainsFunc(rep.Scenarios, func(s *scenarioReport) bool {
		return slices.ContainsFunc(s.Results, func(r *result) bool { return r.PeerRatio > 0 })
	}) {
		against, col = "the floor's (the least work a request can do)", "× floor"
	}
	fmt.Fprintf(w, "pglimit load test on %d CPUs; load average %s at the start.\n", runtime.NumCPU(), orNone(rep.Meta.LoadStart))
	if l := load1Of(rep.Meta.LoadStart); l > float64(runtime.NumCPU()) {
		fmt.Fprintf(w, "WARNING: the load average exceeds the %d cores: the figures are noise; run again on a quiet machine.\n", runtime.NumCPU())
	}
	fmt.Fprintf(w, "Each ratio is pglimit's decisions/s over %s,\nat the same workers: above 1 is faster.\n\n", against)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "scenario\tworkers\tdefault\t%s\tfastest\t%s\tover-admitted\n", col, col)
	var picks []string
	for _, s := range rep.Scenarios {
		for _, lv := range levelsOf(s) {
			def, best, over := verdictAt(rep, lv)
			if def == nil {
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\n", s.Name, conc(def.r), def.name, def.figure(), best.name, best.figure(), over)
			if best.rate >= pickMargin*def.rate {
				picks = append(picks, fmt.Sprintf("  %s, %s workers: %s, %.1fx the default, %s", s.Name, conc(def.r), best.name, best.rate/def.rate, tradeOf(best.name)))
			}
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Which to pick, from these figures (a variant %.0f%% or more faster than the default):\n", 100*(pickMargin-1))
	for _, p := range picks {
		fmt.Fprintln(w, p)
	}
	if len(picks) == 0 {
		fmt.Fprintln(w, "  none: the default (Upsert, durable) is as fast as any variant here; keep it.")
	} else {
		fmt.Fprintln(w, "  Elsewhere, keep the default: no variant beats it by that much.")
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "default: Config's default (Upsert), durable. fastest: the quickest pglimit variant measured here;")
	fmt.Fprintln(w, "  -async trades the last commits before a crash for speed, -preblock adds a local pre-check,")
	fmt.Fprintln(w, "  nowait refuses at once what it would wait for. A figure in /s: no peer in that scenario.")
	fmt.Fprintln(w, "  over-admitted must be 0: any admission past a limit fails the run.")
}

// pickMargin is how much faster than the default a variant must be for
// the verdict to suggest it: less is within a run's noise.
const pickMargin = 1.2

// tradeOf says when a variant is worth what it trades, by its name.
func tradeOf(name string) string {
	switch {
	case strings.Contains(name, "-async"):
		return "if a crash may lose the last commits"
	case strings.Contains(name, "-unlogged"):
		return "if a crash may reset every key"
	case strings.Contains(name, "-preblock"):
		return "for keys refused over and over"
	case strings.HasPrefix(name, "nowait"):
		return "if a busy key may refuse instead of wait"
	case strings.HasPrefix(name, "range"):
		return "for a cooldown kept as rows"
	}
	return "at no cost to a promise"
}

// A variant's mean over the rounds of one level of a scenario.
type verdictRow struct {
	name  string
	rate  float64
	ratio float64
	r     *result
}

// figure is the row's ratio, or its decisions per second where the
// scenario measured nothing to compare with.
func (v *verdictRow) figure() string {
	if v.ratio == 0 {
		return num(v.rate) + "/s"
	}
	return fmt.Sprintf("%.2f", v.ratio)
}

// levelsOf groups a scenario's results by level, in order.
func levelsOf(s *scenarioReport) [][]*result {
	var out [][]*result
	at := map[int]int{}
	for _, r := range s.Results {
		i, ok := at[r.Concurrency]
		if !ok {
			i = len(out)
			at[r.Concurrency] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], r)
	}
	return out
}

// verdictAt gives, for one level's results, the default strategy's row
// (the first upsert variant), the fastest pglimit variant's, and pglimit's
// over-admissions; def is nil when no pglimit variant ran there.
func verdictAt(rep *report, res []*result) (def, best *verdictRow, over int) {
	rows := map[string]*verdictRow{}
	var order []string
	n := map[string]int{}
	for _, r := range res {
		v := rep.variants[r.Variant]
		if v.Floor || v.Redis || v == naive {
			continue
		}
		if c := bestCheck(r); c != nil {
			over += c.OverAdmitted
		}
		row, ok := rows[r.Variant]
		if !ok {
			row = &verdictRow{name: r.Variant, r: r}
			rows[r.Variant] = row
			order = append(order, r.Variant)
		}
		row.rate += r.Rate
		row.ratio += cmpRatio(r)
		n[r.Variant]++
	}
	for _, name := range order {
		row := rows[name]
		row.rate /= float64(n[name])
		row.ratio /= float64(n[name])
		if def == nil && strings.HasPrefix(name, "upsert") {
			def = row
		}
	}
	if def == nil {
		def = rows[order[0]]
	}
	// The fastest of the variants that ran the default's workload: a
	// busy key's 20k limit admits more than its 5k one, which says nothing
	// of which strategy or option to pick.
	for _, name := range order {
		if row := rows[name]; workload(name) == workload(def.name) && (best == nil || row.rate > best.rate) {
			best = row
		}
	}
	return def, best, over
}

// workload is a variant's name without its strategy and options: what it
// was asked to do, such as "-5k" for a busy key's limit of 5,000 a second.
func workload(name string) string {
	for _, s := range []string{"upsert", "nowait", "range"} {
		if rest, ok := strings.CutPrefix(name, s); ok {
			name = rest
			break
		}
	}
	for _, opt := range []string{"-async", "-preblock-inv", "-preblock", "-unlogged"} {
		name = strings.Replace(name, opt, "", 1)
	}
	return name
}

// cmpRatio is r's ratio to the peer, or to the floor where the peer did
// not run.
func cmpRatio(r *result) float64 {
	if r.PeerRatio > 0 {
		return r.PeerRatio
	}
	return r.Ratio
}

// load1Of reads the 1-minute figure of a "1 5 15" load average.
func load1Of(s string) float64 {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func orNone(s string) string {
	if s == "" {
		return "(not shown by this system)"
	}
	return s
}
