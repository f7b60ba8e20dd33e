package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// report is everything a run found; results.json is this, marshalled.
type report struct {
	Meta      meta              `json:"meta"`
	Scenarios []*scenarioReport `json:"scenarios"`
	Failures  []string          `json:"failures"`
	Notes     []string          `json:"notes"`
	Charts    []string          `json:"charts"`
	// Costs compare the limit variants with the cooldown (cost.go).
	Costs []costFigure `json:"costs,omitempty"`

	variants map[string]variant
}

type meta struct {
	Command   string            `json:"command"`
	Started   string            `json:"started"`
	Finished  string            `json:"finished"`
	Go        string            `json:"go"`
	Platform  string            `json:"platform"`
	CPUs      int               `json:"cpus"`
	CPUModel  string            `json:"cpu_model,omitempty"`
	LoadStart string            `json:"load_average_start,omitempty"`
	LoadEnd   string            `json:"load_average_end,omitempty"`
	Database  string            `json:"database,omitempty"`
	Settings  map[string]string `json:"settings,omitempty"`
	Target    string            `json:"target"`
	Floor     string            `json:"floor"`
	// In-process only; the Redis ones when the peer ran.
	WriteFloor string `json:"write_floor,omitempty"`
	RedisFloor string `json:"redis_floor,omitempty"`
	Peer       string `json:"peer,omitempty"`
}

type scenarioReport struct {
	Name       string    `json:"name"`
	About      string    `json:"about"`
	CooldownMS float64   `json:"cooldown_ms"`
	DurationS  float64   `json:"planned_duration_s"`
	Results    []*result `json:"results"`
	// Load spans the 1-minute load average around its runs; Busy names the
	// runs that started above the machine's cores, whose figures are noise.
	Load string `json:"load_average,omitempty"`
	Busy string `json:"busy_runs,omitempty"`
}

func newReport(o *options) *report {
	rep := &report{
		Meta: meta{
			Command:   o.command,
			Started:   time.Now().UTC().Format(time.RFC3339),
			Go:        runtime.Version(),
			Platform:  runtime.GOOS + "/" + runtime.GOARCH,
			CPUs:      runtime.NumCPU(),
			CPUModel:  cpuModel(),
			LoadStart: loadAverage(),
		},
		Failures: []string{},
		Notes:    []string{},
		Charts:   []string{},
		variants: map[string]variant{},
	}
	for _, v := range floors(o.variants, o.targets == nil) {
		rep.variants[v.Name] = v
	}
	for _, v := range o.variants {
		rep.variants[v.Name] = v
	}
	return rep
}

func (rep *report) add(sc *scenario, res []*result) {
	rep.Scenarios = append(rep.Scenarios, &scenarioReport{
		Name: sc.Name, About: sc.About, CooldownMS: ms(sc.Cooldown), DurationS: sc.Duration.Seconds(), Results: res,
		Load: loadSpan(res), Busy: busyRuns(res, runtime.NumCPU()),
	})
	for _, v := range sc.Variants {
		rep.variants[v.Name] = v
	}
	if isCostScenario(sc.Name) {
		rep.Costs = append(rep.Costs, costFigures(rep.Scenarios[len(rep.Scenarios)-1])...)
	}
	if sc.Name == scTiers {
		rep.Notes = append(rep.Notes, tiersNotes(sc, res)...)
	}
	for _, r := range res {
		v := rep.variants[r.Variant]
		rep.Failures = append(rep.Failures, failures(r, v)...)
		rep.Notes = append(rep.Notes, findings(r, v)...)
	}

}

func (rep *report) finish() {
	rep.Meta.Finished = time.Now().UTC().Format(time.RFC3339)
	rep.Meta.LoadEnd = loadAverage()
}

// load1 reads the 1-minute load average, 0 where the system does not show
// it.
func load1() float64 { return load1Of(loadAverage()) }

// loadAverage reads the 1, 5 and 15 minute load averages, where the system
// shows them: figures taken on a busy machine are noisy.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// writeOutputs writes results.json, report.md and the charts into dir.
func writeOutputs(dir string, rep *report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	charts, err := writeCharts(dir, rep)
	if err != nil {
		return fmt.Errorf("charts: %w", err)
	}
	rep.Charts = charts
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "report.md"))
	if err != nil {
		return err
	}
	writeMarkdown(f, rep)
	return f.Close()
}

func writeMarkdown(w io.Writer, rep *report) {
	m := rep.Meta
	fmt.Fprintf(w, "# pglimit load test\n\n")
	fmt.Fprintf(w, "`%s`\n\n", m.Command)
	fmt.Fprintf(w, "- Started %s, finished %s; %s, %s, %d CPUs", m.Started, m.Finished, m.Go, m.Platform, m.CPUs)
	if m.CPUModel != "" {
		fmt.Fprintf(w, " (%s)", m.CPUModel)
	}
	fmt.Fprintln(w)
	if m.LoadStart != "" {
		fmt.Fprintf(w, "- Load average (1, 5, 15 min) at start %s, at end %s (the end includes this run's own load; "+
			"other work on the machine makes figures noisy).\n", m.LoadStart, m.LoadEnd)
	}
	fmt.Fprintf(w, "- Target: %s\n", m.Target)
	if m.Database != "" {
		fmt.Fprintf(w, "- Database: %s", m.Database)
		if len(m.Settings) > 0 {
			var kv []string
			for _, k := range slices.Sorted(maps.Keys(m.Settings)) {
				kv = append(kv, k+"="+m.Settings[k])
			}
			fmt.Fprintf(w, " (%s)", strings.Join(kv, ", "))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "- Floors, measured at every level with the same instances: `%s` (floor)", m.Floor)
	if m.WriteFloor != "" {
		fmt.Fprintf(w, ", `%s` in autocommit on pre-seeded keys (floor-write)", m.WriteFloor)
	}
	if m.RedisFloor != "" {
		fmt.Fprintf(w, ", Redis `%s` (floor-redis)", m.RedisFloor)
	}
	fmt.Fprintln(w)
	if m.Peer != "" {
		fmt.Fprintf(w, "- Peer: %s. Same workers, keys and cooldown as the strategies; its admissions are checked "+
			"by the client only (Redis keeps no record of them).\n", m.Peer)
	}
	fmt.Fprintln(w)
	if len(rep.Failures) == 0 {
		fmt.Fprintf(w, "**PASS**: no pglimit strategy over-admitted (range-naive and the peer are reported in the notes), Range never deadlocked, the seed load saw no errors.\n\n")
	} else {
		fmt.Fprintf(w, "**FAIL**:\n\n")
		for _, f := range rep.Failures {
			fmt.Fprintf(w, "- %s\n", f)
		}
		fmt.Fprintln(w)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "> %s\n\n", n)
	}

	for _, s := range rep.Scenarios {
		fmt.Fprintf(w, "## %s\n\n%s Cooldown %s, %s per run.\n\n", s.Name, s.About,
			short(time.Duration(s.CooldownMS*float64(time.Millisecond))), short(time.Duration(s.DurationS*float64(time.Second)).Round(time.Millisecond)))
		if s.Load != "" {
			fmt.Fprintf(w, "The %s.\n\n", s.Load)
		}
		if s.Busy != "" {
			fmt.Fprintf(w, "Started at a load average above this machine's %d cores: %s. The 1-minute average still carries "+
				"the load test's own earlier runs; where the run began on a busy machine too, measure them again on a quiet one.\n\n",
				runtime.NumCPU(), s.Busy)
		}
		fmt.Fprintln(w, "| conc | strategy | decisions/s | × floor | × write floor | × redis_rate | p50 ms | p95 ms | p99 ms | max ms | errors |")
		fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
		for _, r := range s.Results {
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", conc(r), r.Variant, num(r.Rate),
				ratio(r.Ratio), ratio(r.WriteRatio), ratio(r.PeerRatio), num(r.Latency.P50), num(r.Latency.P95), num(r.Latency.P99), num(r.Latency.Max), errorsCol(r))
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| conc | strategy | admitted | allowed | over (client) | db record | max gap ms | lost periods | commits | rollbacks | deadlocks | lock waiters | WAL B/decision | WAL syncs | in flight |")
		fmt.Fprintln(w, "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, r := range s.Results {
			if rep.variants[r.Variant].Floor {
				continue
			}
			gap, lost := "–", "–"
			if c := bestCheck(r); c != nil && r.HotKey && r.Limits == "" {
				gap, lost = fmt.Sprintf("%.0f", c.MaxGapMS), fmt.Sprint(c.LostPeriods)
			}
			waiters := "–"
			if r.DB != nil {
				waiters = fmt.Sprint(r.LockWaitMax)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", conc(r), r.Variant,
				admittedCol(r), allowedCol(r), overCol(r.Client), recordCol(r), gap, lost,
				dbCol(r, func(d *dbStats) int64 { return d.Commits }), dbCol(r, func(d *dbStats) int64 { return d.Rollbacks }),
				deadlocksCol(r), waiters, walPerDecision(r), dbCol(r, func(d *dbStats) int64 { return d.WALSyncs }), levelsCol(r.Levels))
		}
		fmt.Fprintln(w)
		switch s.Name {
		case scLimits:
			writeLimitsTable(w, s)
		case scTiers:
			writeTiersTable(w, s)
		}
		for _, c := range rep.Charts {
			if strings.HasPrefix(c, s.Name+"-") {
				fmt.Fprintf(w, "![%s](%s)\n\n", strings.TrimSuffix(c, ".png"), c)
			}
		}
	}
	if len(rep.Costs) > 0 {
		writeCostTable(w, rep.Costs)
	}
	fmt.Fprint(w, readingGuide)
}

// writeLimitsTable shows, for the limits scenario, how close each limit
// came to its bound in the database's record, and the record's slack.
func writeLimitsTable(w io.Writer, s *scenarioReport) {
	fmt.Fprintln(w, "| strategy | limits | db record | headroom per limit (record) | widest decision bracket ms | headroom (client) |")
	fmt.Fprintln(w, "|---|---|---|---|---:|---|")
	for _, r := range s.Results {
		if r.Limits == "" {
			continue
		}
		head := func(c *admissionCheck) string {
			if c == nil || c.Headroom == nil {
				return "–"
			}
			var parts []string
			for _, k := range slices.Sorted(maps.Keys(c.Headroom)) {
				parts = append(parts, fmt.Sprintf("%s %d", k, c.Headroom[k]))
			}
			return strings.Join(parts, ", ")
		}
		slack := "–"
		if r.Record != nil {
			slack = fmt.Sprintf("%.2f", r.Record.SlackMaxMS)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", r.Variant, r.Limits, recordCol(r), head(r.Record), slack, head(r.Client))
	}
	fmt.Fprintln(w)
}

// tiersNotes says which runs of the tiers scenario sc refused requests:
// its users were too few for the run's pace, and a refusal costs both
// sides less than the admission the workload stands for.
func tiersNotes(sc *scenario, res []*result) []string {
	burst := tiersLimits[0].Burst
	var out []string
	for _, r := range res {
		if r.Refused == 0 {
			continue
		}
		out = append(out, fmt.Sprintf("%s: %s at %d workers refused %d of %d requests. With %d users taken in turn a run "+
			"admits every request while it makes at most %d (the minute's burst, %d, per user); for the every-request-admitted "+
			"workload raise -keys or lower -scale.", sc.Name, r.Variant, r.Concurrency, r.Refused, r.Decisions, sc.Keys, burst*sc.Keys, burst))
	}
	return out
}

// writeTiersTable shows, for the tiers scenario, each run beside the peer
// without persistence and with appendfsync always at its level, how much
// it admitted, and how many calls the peer made per decision.
func writeTiersTable(w io.Writer, s *scenarioReport) {
	always := peerAlways.Name + "-" + setTiers
	alwaysRate := map[int]float64{}
	for _, r := range s.Results {
		if r.Variant == always {
			alwaysRate[r.Concurrency] = r.Rate
		}
	}
	fmt.Fprintln(w, "| conc | strategy | decisions/s | × redis_rate | × redis_rate AOF always | p99 ms | admitted | Redis calls per decision |")
	fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|")
	for _, r := range s.Results {
		vsAlways := 0.0
		if b := alwaysRate[r.Concurrency]; b > 0 && r.Variant != always {
			vsAlways = r.Rate / b
		}
		calls := "–"
		if r.RedisCalls > 0 && r.Decisions > 0 {
			calls = fmt.Sprintf("%.2f", float64(r.RedisCalls)/float64(r.Decisions))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %d of %d | %s |\n", conc(r), r.Variant, num(r.Rate), ratio(r.PeerRatio),
			ratio(vsAlways), num(r.Latency.P99), r.Admitted, r.Decisions, calls)
	}
	fmt.Fprintln(w)
}

const readingGuide = `## How to read this

- **decisions/s** counts every answered request (admitted, refused or failed) over the run. **× floor** divides it by
  the floor measured in the same run, at the same concurrency, with identically sized fresh pools: ` + "`SELECT 1`" + `
  in-process, ` + "`GET /healthz`" + ` over HTTP. The seed load is open loop (a fixed arrival rate), so its × floor is
  about 1 by construction and only its latency compares.
- **× write floor** (in-process) divides by the write floor (floor-write): the cheapest durable single-row write by
  primary key, an autocommit ` + "`UPDATE ... SET expires_at = now()`" + ` of a pre-seeded row of the Upsert table as
  migrated, on the same keys. A durable admission writes at least that much, so where nearly every request admits
  (many-keys) a durable strategy can hardly beat it; AsyncCommit can, by not waiting for the WAL flush. On a hot key
  it is every request writing the one row in turn, which a refusal that writes nothing beats by far.
- **× redis_rate** divides by the peer, github.com/go-redis/redis_rate (GCRA in a Lua script) on a redis-server the
  load test starts without persistence, with the same workers, keys and cooldown (Limit{Rate: 1, Period: cooldown,
  Burst: 1}), each instance its own go-redis client with as many connections as a strategy's pool. floor-redis is a
  Redis ` + "`PING`" + ` through the same clients: the peer's round-trip floor.
- **Latency** is measured per request, errors included, from the moment it was due (open loop) or sent (closed loop)
  to its answer, recorded in an HDR histogram (3 significant digits).
- **admitted / allowed / over (client)**: per key, the admissions seen by the load test, against the most the cooldown
  allows in the time they span, floor(span / cooldown) + 1; over = Σ max(0, admitted − allowed), plus every pair of
  admissions whose send and receive times prove them less than a cooldown apart. Must be 0 for every strategy and
  for the peer, whose admissions only the client sees.
- **db record**: the same check on the database's own record of admissions, on the database clock: the Range
  table's rows (one per admission), or for Upsert and NoWait an audit trigger that logs every admitting write
  (refusals write nothing, so it costs only on admissions; it is off in many-keys, where it would double the writes).
  A difference between its count and the client's means an admission the client did not see as one (or the reverse).
- **General limits** (limits scenario; variants named ` + "`<strategy>-gcra`, `<strategy>-3limits`" + `): allowed is
  the most the limits together allow in the time a key's admissions span. From the database's record, a GCRA limit
  (T = Period/Rate rounded up to the µs) must never admit more than Burst + floor(w/T) in any interval of length w,
  where w is the longest the interval of those decisions can be: each decision lies between its statement's start
  (or the previous admission's trigger, whose lock it waited for) and its trigger's clock reading, so no slack is
  assumed; **widest decision bracket** is the widest such span measured, which makes the check more lenient, never
  wrong. Fixed and sliding windows are checked exactly: admissions grouped by the window start the row's state
  records, at most Rate each (fixed windows never overlap, sliding ones are aligned). **headroom** is, per limit,
  how far the closest interval or window stayed below its bound: 0 means the limit was reached, so the check bit.
  The client's check is the same with [sent, received] brackets and, for windows, Rate × (floor(w/Period) + 2).
- **tiers** (variants named ` + "`<name>-tiers`" + `): Upsert and NoWait decide both limits in one statement on one
  row; redis_rate checks them with two calls, the day (its own Redis key) only if the minute admitted, and takes the
  day's fixed window as GCRA with a burst of 1,000, having no window algorithm. **Redis calls per decision** is the
  server's count of scripts run (` + "`INFO commandstats`" + `) over the run's decisions: 2 when every request is
  admitted. **× redis_rate AOF always** divides by the peer with appendfsync always, pglimit's durability class.
- **max gap / lost periods**: the longest time between two admissions of a key, and the whole cooldown periods in
  which nobody was admitted though requests kept coming (meaningful for a hot key whose cooldown keeps expiring).
- **Database columns** are server-side differences across each run: commits and rollbacks from pg_stat_database
  (an exclusion violation or a deadlock victim is a rollback), deadlocks, WAL bytes from the WAL position per
  decision, WAL syncs (flushes; fewer than commits means group commit) from pg_stat_wal. **lock waiters** is the
  most backends seen waiting on a lock at once (pg_stat_activity, sampled every 250 ms): a pile-up.
- **Errors** are by SQLSTATE (40P01 deadlock_detected, 23P01 exclusion_violation, 55P03 lock_not_available, 57014
  query_canceled), else timeout, canceled, http-<status> or other.
`

// short formats d without zero minutes and seconds: 1h, not 1h0m0s.
func short(d time.Duration) string {
	return strings.Replace(strings.Replace(d.String(), "m0s", "m", 1), "h0m", "h", 1)
}

// bestCheck prefers the database's record to the client's view.
func bestCheck(r *result) *admissionCheck {
	if r.Record != nil {
		return r.Record
	}
	return r.Client
}

func conc(r *result) string {
	if r.Concurrency == 0 {
		return "open"
	}
	return fmt.Sprint(r.Concurrency)
}

// ratio formats a ratio to a floor or the peer; 0 is one not measured.
func ratio(x float64) string {
	if x == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", x)
}

func admittedCol(r *result) string {
	if r.Client == nil {
		return "–"
	}
	return fmt.Sprint(r.Admitted)
}

func allowedCol(r *result) string {
	if r.Client == nil {
		return "–"
	}
	return fmt.Sprint(r.Client.MaxAllowed)
}

func overCol(c *admissionCheck) string {
	if c == nil {
		return "–"
	}
	return fmt.Sprint(c.OverAdmitted + c.Violations)
}

func recordCol(r *result) string {
	c := r.Record
	if c == nil {
		return "n/a"
	}
	state := "ok"
	if !c.ok() {
		state = fmt.Sprintf("OVER %d", c.OverAdmitted+c.Violations)
	}
	return fmt.Sprintf("%s %d/%d", state, c.Admitted, c.MaxAllowed)
}

func errorsCol(r *result) string {
	if r.ErrorCount == 0 && r.Dropped == 0 {
		return "0"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(r.Errors)) {
		parts = append(parts, fmt.Sprintf("%s:%d", k, r.Errors[k]))
	}
	if r.Dropped > 0 {
		parts = append(parts, fmt.Sprintf("dropped:%d", r.Dropped))
	}
	return strings.Join(parts, " ")
}

// levelsCol is the in-flight levels the instances' limiters settled on,
// one per instance; "–" where none gathers.
func levelsCol(levels []int) string {
	if len(levels) == 0 {
		return "–"
	}
	parts := make([]string, len(levels))
	for i, l := range levels {
		parts[i] = strconv.Itoa(l)
	}
	return strings.Join(parts, " / ")
}

func deadlocksCol(r *result) string {
	if r.DB == nil {
		return fmt.Sprint(r.Errors["40P01"])
	}
	return fmt.Sprint(r.DB.Deadlocks)
}

func dbCol(r *result, f func(*dbStats) int64) string {
	if r.DB == nil {
		return "–"
	}
	return fmt.Sprint(f(r.DB))
}

func walPerDecision(r *result) string {
	if r.DB == nil || r.Decisions == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", float64(r.DB.WALBytes)/float64(r.Decisions))
}

// num formats a rate or a latency to a sensible precision.
func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// busyRuns lists the runs of res that started at a load average above
// cores, with the load of each, or "" if none did.
func busyRuns(res []*result, cores int) string {
	var busy []string
	for _, r := range res {
		if r.LoadStart > float64(cores) {
			busy = append(busy, fmt.Sprintf("%s at concurrency %s (%.2f)", r.Variant, conc(r), r.LoadStart))
		}
	}
	return strings.Join(busy, ", ")
}

// loadSpan gives the range of the 1-minute load average at the starts and
// at the ends of the runs of res, or "" where the system shows none.
func loadSpan(res []*result) string {
	var starts, ends []float64
	for _, r := range res {
		if r.LoadStart > 0 || r.LoadEnd > 0 {
			starts, ends = append(starts, r.LoadStart), append(ends, r.LoadEnd)
		}
	}
	if len(starts) == 0 {
		return ""
	}
	return fmt.Sprintf("load average (1 min) was %.2f-%.2f as the runs started, %.2f-%.2f as they ended",
		slices.Min(starts), slices.Max(starts), slices.Min(ends), slices.Max(ends))
}
