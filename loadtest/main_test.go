package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// tiny runs every scenario in a few seconds.
var tiny = []string{"-short", "-scale", "0.15", "-levels", "1,8", "-keys", "1000", "-rounds", "1", "-progress=false"}

// runLoadtest runs the command with args plus -out, expects exit code want,
// and returns the parsed results.json.
func runLoadtest(t *testing.T, want int, args ...string) (*report, string) {
	t.Helper()
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), append(args, "-out", out), &stdout, &stderr)
	if code != want {
		t.Fatalf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", code, want, &stdout, &stderr)
	}
	if !strings.Contains(stdout.String(), "over-admitted") || !strings.Contains(stdout.String(), filepath.Join(out, "report.md")) {
		t.Errorf("no verdict, or no path to report.md, on stdout:\n%s", &stdout)
	}
	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	return &rep, out
}

// checkOutputs checks report.md and the charts exist and are readable.
func checkOutputs(t *testing.T, out string, rep *report, charts []string) {
	t.Helper()
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Scenarios {
		if !bytes.Contains(md, []byte("## "+s.Name+"\n")) {
			t.Errorf("report.md has no section for %s", s.Name)
		}
	}
	if strings.Join(rep.Charts, ",") != strings.Join(charts, ",") {
		t.Errorf("charts %q, want %q", rep.Charts, charts)
	}
	for _, c := range charts {
		f, err := os.Open(filepath.Join(out, c))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := png.DecodeConfig(f)
		f.Close()
		if err != nil || cfg.Width < 400 || cfg.Height < 200 {
			t.Errorf("%s: %dx%d, %v; want a readable PNG", c, cfg.Width, cfg.Height, err)
		}
		// 300 KB: TestInProcess's seed chart has a tile for each of its 17
		// variants and floors, 199-242 KB measured.
		if fi, err := os.Stat(filepath.Join(out, c)); err != nil || fi.Size() > 300<<10 {
			t.Errorf("%s: larger than 300 KB or unreadable (%v)", c, err)
		}
		if !bytes.Contains(md, []byte("("+c+")")) {
			t.Errorf("report.md does not show %s", c)
		}
	}
}

// checkResults asserts what must hold in every run: every scenario of
// levels, at its number of levels, and every floor and variant ran (the
// limit scenarios: their own variants, once each); no floor failed; nothing
// but range-naive over-admitted; hot keys were admitted at least once; the
// seed load saw no errors.
func checkResults(t *testing.T, rep *report, floors, variants []string, levels map[string]int) {
	t.Helper()
	if len(rep.Failures) > 0 {
		t.Errorf("failures: %q", rep.Failures)
	}
	if len(rep.Scenarios) != len(levels) {
		t.Fatalf("%d scenarios, want %d", len(rep.Scenarios), len(levels))
	}
	for _, s := range rep.Scenarios {
		want := levels[s.Name] * (len(floors) + len(variants))
		switch {
		case s.Name == scBusy:
			want = levels[s.Name] * len(busyVariants())
		case s.Name == scTiers:
			want = levels[s.Name] * len(tiersVariants())
		case slices.Contains(limitScenarios, s.Name):
			want = levels[s.Name] * len(limitVariants())
		}
		if len(s.Results) != want {
			t.Errorf("%s: %d results, want %d", s.Name, len(s.Results), want)
		}
		for _, r := range s.Results {
			name := s.Name + "/" + strconv.Itoa(r.Concurrency) + "/" + r.Variant
			if r.Decisions == 0 || math.IsNaN(r.Rate) || r.Latency.P99 <= 0 {
				t.Errorf("%s: no decisions measured: %+v", name, r)
			}
			if slices.Contains(floors, r.Variant) {
				if r.ErrorCount > 0 || r.Client != nil {
					t.Errorf("%s: a floor with errors %v or an admission check", name, r.Errors)
				}
				continue
			}
			if r.Client == nil {
				t.Errorf("%s: no admission check", name)
				continue
			}
			if r.Variant == naive.Name {
				t.Logf("%s (reported, not asserted): admitted %d, client check %+v, record %+v, errors %v",
					name, r.Admitted, *r.Client, r.Record, r.Errors)
				continue
			}
			if r.Client.OverAdmitted != 0 || r.Client.Violations != 0 {
				t.Errorf("%s: over-admitted: %+v", name, *r.Client)
			}
			if r.Record != nil && (r.Record.OverAdmitted != 0 || r.Record.Violations != 0) {
				t.Errorf("%s: the database's record shows over-admission: %+v", name, *r.Record)
			}
			if r.Admitted == 0 {
				t.Errorf("%s: nothing admitted", name)
			}
			if s.Name == scSeed && r.ErrorCount > 0 {
				t.Errorf("%s: errors %v", name, r.Errors)
			}
		}
	}
}

var allCharts = []string{"seed-latency.png", "contention-throughput.png", "contention-p99.png", "range-naive-admissions.png"}

// needRedis stops a test that runs the peer on a machine without
// redis-server.
func needRedis(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		testdb.Missing(t, "%v", errNoRedis)
	}
}

func TestInProcess(t *testing.T) {
	testdb.Slow(t)
	t.Parallel()
	needRedis(t)
	// Every variant, so that CI checks the options for over-admission too,
	// and the peer.
	var names []string
	for _, v := range allVariants() {
		names = append(names, v.Name)
	}
	// The limit scenarios run beside, in TestLimits.
	rep, out := runLoadtest(t, exitOK, append([]string{"-database-url", testdb.URL(t), "-strategies", strings.Join(names, ","),
		"-scenarios", strings.Join([]string{scSeed, scContention, scManyKeys, scNaive}, ",")}, tiny...)...)
	fl := []string{floorName, writeFloorName, pingFloorName}
	checkResults(t, rep, fl, names, map[string]int{scSeed: 1, scContention: 2, scManyKeys: 1, scNaive: 1})
	checkOutputs(t, out, rep, allCharts)
	if !strings.Contains(rep.Meta.Peer, "redis-server 7") || !strings.Contains(rep.Meta.Peer, "without persistence") {
		t.Errorf("the report does not say which Redis the peer ran on, and how: %q", rep.Meta.Peer)
	}

	for _, s := range rep.Scenarios {
		for _, r := range s.Results {
			name := s.Name + "/" + strconv.Itoa(r.Concurrency) + "/" + r.Variant
			onRedis := strings.HasPrefix(r.Variant, peerName) || r.Variant == pingFloorName
			// The peer's runs leave PostgreSQL alone: no deltas to show.
			if onRedis != (r.DB == nil) || (r.DB != nil && r.DB.Commits == 0) {
				t.Errorf("%s: database deltas %+v", name, r.DB)
			}
			// Every figure beside the floors and the peer, but their own.
			if (r.Variant != floorName) != (r.Ratio > 0) || (r.Variant != writeFloorName) != (r.WriteRatio > 0) ||
				(r.Variant != peerName) != (r.PeerRatio > 0) {
				t.Errorf("%s: ratios %.2f × floor, %.2f × write floor, %.2f × redis_rate", name, r.Ratio, r.WriteRatio, r.PeerRatio)
			}
			// The database keeps a record wherever the scenario audits, and
			// always for Range.
			wantRecord := !slices.Contains(fl, r.Variant) && !onRedis &&
				(s.Name != scManyKeys || strings.HasPrefix(r.Variant, "range"))
			if (r.Record != nil) != wantRecord {
				t.Errorf("%s: database record %+v, want one: %t", name, r.Record, wantRecord)
			}
			if r.Record != nil && r.Variant != naive.Name && r.Record.Admitted != r.Client.Admitted {
				t.Errorf("%s: the database recorded %d admissions, the client saw %d", name, r.Record.Admitted, r.Client.Admitted)
			}
		}
	}
}

// TestBusyKey runs the busy-key scenario: every limit on the peer and on
// both strategies, each pglimit row compared with the peer of its limit,
// and every admission checked by the client.
func TestBusyKey(t *testing.T) {
	t.Parallel()
	args := append([]string{"-database-url", testdb.URL(t), "-scenarios", scBusy, "-busy-levels", "8"}, tiny...)
	rep, _ := runLoadtest(t, exitOK, append(args, "-scale", "0.1")...)
	checkResults(t, rep, nil, nil, map[string]int{scBusy: 1})
	for _, r := range rep.Scenarios[0].Results {
		if r.Client == nil || r.Client.Admitted == 0 || r.ErrorCount > 0 {
			t.Errorf("%s: client check %+v, errors %v; want admissions checked and no error", r.Variant, r.Client, r.Errors)
		}
		if r.Variant == peerName+"-"+r.Limits {
			continue
		}
		if r.PeerRate == 0 {
			t.Errorf("%s: no ratio to %s-%s", r.Variant, peerName, r.Limits)
		}
		if r.Record == nil || r.Record.MaxAllowed < r.Record.Admitted || r.Record.Admitted != r.Client.Admitted {
			t.Errorf("%s: database record %+v; want every admission the clients saw within the units written", r.Variant, r.Record)
		}
	}
}

// TestLimits runs the limit scenarios, whose variants are their own: the
// database recorded every admission of the limits scenario and checked
// every limit on it, and the cost figures are all there, in the JSON and
// the Markdown.
func TestLimits(t *testing.T) {
	t.Parallel()
	// Shorter than tiny, and one of the two cost workloads (the other
	// differs only in its keys), to keep CI's time: the bounds and the cost
	// figures are measured at length by -short.
	args := append([]string{"-database-url", testdb.URL(t), "-scenarios", scLimits + "," + scCostHot}, tiny...)
	rep, out := runLoadtest(t, exitOK, append(args, "-scale", "0.1")...)
	checkResults(t, rep, nil, nil, map[string]int{scLimits: 1, scCostHot: 1})
	checkOutputs(t, out, rep, nil)
	for _, s := range rep.Scenarios {
		if s.Name != scLimits {
			continue
		}
		for _, r := range s.Results {
			if r.Record == nil || r.Client == nil {
				t.Errorf("limits/%s: record %+v, client %+v; want both", r.Variant, r.Record, r.Client)
				continue
			}
			if r.Record.Admitted != r.Client.Admitted || r.ErrorCount > 0 {
				t.Errorf("limits/%s: the database recorded %d admissions, the client saw %d; errors %v",
					r.Variant, r.Record.Admitted, r.Client.Admitted, r.Errors)
			}
			// How close each came to its bound depends on the machine's
			// speed: logged, not asserted.
			want := map[string][]string{"": nil, setGCRA: {"rate"}, setThree: {"rate", "window", "sliding"}}[r.Limits]
			for _, name := range want {
				if _, ok := r.Record.Headroom[name]; !ok {
					t.Errorf("limits/%s: limit %s not checked on the record (headroom %v)", r.Variant, name, r.Record.Headroom)
				}
			}
			t.Logf("limits/%s: %d admitted, headroom %v, widest bracket %.2f ms", r.Variant, r.Admitted, r.Record.Headroom, r.Record.SlackMaxMS)
		}
	}
	if len(rep.Costs) != 2*len(limitStrategies) {
		t.Fatalf("%d cost figures, want %d: %+v", len(rep.Costs), 2*len(limitStrategies), rep.Costs)
	}
	for _, c := range rep.Costs {
		if c.Ratio <= 0 || c.RateRatio <= 0 || c.Target == 0 || len(c.RoundRatios) != 1 {
			t.Errorf("cost figure %+v", c)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(md, []byte("## Cost of general limits")) || !bytes.Contains(md, []byte("| cost-hot-key | 16 | nowait-3limits |")) {
		t.Errorf("report.md has no cost table")
	}
}

// TestTiers runs the tiers scenario with the audit trigger: every request
// admitted by every variant, the peer's two calls per request by Redis's
// own count, and every pglimit admission in the database's record, checked
// against both limits.
func TestTiers(t *testing.T) {
	t.Parallel()
	needRedis(t)
	// 10,000 users keep every request admitted up to 30,000 decisions in a
	// run of 150 ms.
	args := append([]string{"-database-url", testdb.URL(t), "-scenarios", scTiers, "-concurrency", "1,8", "-audit"}, tiny...)
	rep, out := runLoadtest(t, exitOK, append(args, "-keys", "10000")...)
	checkResults(t, rep, nil, nil, map[string]int{scTiers: 2})
	checkOutputs(t, out, rep, []string{"tiers-throughput.png"})
	if len(rep.Notes) > 0 {
		t.Errorf("notes %q, want none: every request admitted", rep.Notes)
	}
	for _, r := range rep.Scenarios[0].Results {
		name := strconv.Itoa(r.Concurrency) + "/" + r.Variant
		if r.Admitted != r.Decisions || r.ErrorCount > 0 {
			t.Errorf("%s: %d of %d admitted, errors %v; want every request admitted", name, r.Admitted, r.Decisions, r.Errors)
		}
		if strings.HasPrefix(r.Variant, peerName) {
			if r.RedisCalls != 2*r.Decisions || r.DB != nil || r.Record != nil {
				t.Errorf("%s: %d Redis calls for %d decisions, database %+v, record %+v; want two calls each and nothing in PostgreSQL",
					name, r.RedisCalls, r.Decisions, r.DB, r.Record)
			}
			continue
		}
		if r.PeerRate == 0 || r.RedisCalls != 0 {
			t.Errorf("%s: ratio to %s-%s %.2f, Redis calls %d; want a ratio and no calls", name, peerName, setTiers, r.PeerRatio, r.RedisCalls)
		}
		if r.Record == nil || r.Record.Admitted != r.Client.Admitted {
			t.Errorf("%s: database record %+v, want the %d admissions the client saw", name, r.Record, r.Client.Admitted)
			continue
		}
		for _, l := range tiersLimits {
			if _, ok := r.Record.Headroom[l.Name]; !ok {
				t.Errorf("%s: limit %s not checked on the record (headroom %v)", name, l.Name, r.Record.Headroom)
			}
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range []string{"| 8 | nowait-tiers |", "| 1 | redis_rate-aof-always-tiers |"} {
		if !bytes.Contains(md, []byte(row)) || !bytes.Contains(md, []byte("× redis_rate AOF always")) {
			t.Errorf("report.md has no tiers table row %q", row)
		}
	}
}

// TestNoRedis runs the peer on a machine without redis-server: the load
// test must stop at once and say how to get it. Not parallel: it empties
// PATH.
func TestNoRedis(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"-database-url", "postgres://127.0.0.1:1/none", "-strategies", "upsert,redis_rate",
		"-out", t.TempDir(), "-progress=false"}, &stdout, &stderr)
	if code != exitError || !strings.Contains(stderr.String(), "apt-get install redis-server") {
		t.Errorf("exit code %d, stderr %q; want %d and how to install redis-server", code, &stderr, exitError)
	}
}

// TestCompare checks the ratios beside each run at one level.
func TestCompare(t *testing.T) {
	t.Parallel()
	runs := []*result{
		{Variant: floorName, Rate: 1000},
		{Variant: writeFloorName, Rate: 100},
		{Variant: peerName, Rate: 400},
		{Variant: "upsert", Rate: 200},
	}
	compare(runs)
	want := [][3]float64{{0, 10, 2.5}, {0.1, 0, 0.25}, {0.4, 4, 0}, {0.2, 2, 0.5}}
	for i, r := range runs {
		if got := [3]float64{r.Ratio, r.WriteRatio, r.PeerRatio}; got != want[i] {
			t.Errorf("%s: ratios %v, want %v", r.Variant, got, want[i])
		}
	}
	if r := runs[3]; r.FloorRate != 1000 || r.WriteFloorRate != 100 || r.PeerRate != 400 {
		t.Errorf("upsert: bases %v %v %v", r.FloorRate, r.WriteFloorRate, r.PeerRate)
	}
	// Over HTTP there is only the floor.
	http := []*result{{Variant: floorName, Rate: 10}, {Variant: "upsert-http", Rate: 5}}
	compare(http)
	if r := http[1]; r.Ratio != 0.5 || r.WriteRatio != 0 || r.PeerRatio != 0 {
		t.Errorf("over HTTP: ratios %v %v %v, want 0.5 and none", r.Ratio, r.WriteRatio, r.PeerRatio)
	}
}

// demo stands in for the demo service: GET /items/{user} behind the
// limiter, 200 admitted, 429 with Retry-After refused.
func demo(lim pglimit.Limiter) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /items/{user}", func(w http.ResponseWriter, r *http.Request) {
		d, err := lim.Allow(r.Context(), r.PathValue("user"))
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		case !d.Allowed:
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.RetryAfter.Seconds()))))
			http.Error(w, "slow down", http.StatusTooManyRequests)
		default:
			w.Write([]byte("[]"))
		}
	})
	return mux
}

// demoInstances starts two demo stand-ins sharing one database, as in the
// compose stack, and returns their URLs joined for -target.
func demoInstances(t *testing.T) string {
	schema := testdb.Schema(t)
	var urls []string
	for range 2 {
		lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: schema, Cooldown: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(demo(lim))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	return strings.Join(urls, ",")
}

func TestHTTPTarget(t *testing.T) {
	t.Parallel()
	// The limit scenarios run in-process only.
	rep, out := runLoadtest(t, exitOK, append([]string{"-target", demoInstances(t), "-cooldown", "1s", "-label", "upsert-http"}, tiny...)...)
	checkResults(t, rep, []string{floorName}, []string{"upsert-http"}, map[string]int{scSeed: 1, scContention: 2, scManyKeys: 1, scNaive: 1})
	checkOutputs(t, out, rep, allCharts)
}

// TestHTTPTargetDatabaseDeltas reads the server's counters over HTTP when
// given the database URL.
func TestHTTPTargetDatabaseDeltas(t *testing.T) {
	t.Parallel()
	rep, _ := runLoadtest(t, exitOK, "-target", demoInstances(t), "-cooldown", "1s", "-database-url", testdb.URL(t),
		"-scenarios", "seed", "-short", "-scale", "0.1", "-progress=false")
	for _, r := range rep.Scenarios[0].Results {
		// Decisions reach the database (concurrent ones on one key share
		// a statement and a commit, so fewer commits than decisions is
		// no fault); the floor (GET /healthz) need not touch it.
		if r.DB == nil || (r.Variant != floorName && r.DB.Commits == 0) {
			t.Errorf("%s: database deltas %+v for %d decisions", r.Variant, r.DB, r.Decisions)
		}
		if r.Record != nil {
			t.Errorf("%s: a database record over HTTP, where the load test owns no table", r.Variant)
		}
	}
}

// TestHTTPTargetOverAdmits points the load test at a service that admits
// everything: it must say so and exit 1.
func TestHTTPTargetOverAdmits(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(srv.Close)
	rep, _ := runLoadtest(t, exitFailed, "-target", srv.URL, "-scenarios", "seed,contention", "-levels", "2",
		"-short", "-scale", "0.1", "-progress=false")
	if len(rep.Failures) == 0 || !strings.Contains(rep.Failures[0], "over-admitted") {
		t.Fatalf("failures %q, want over-admission", rep.Failures)
	}
}

func TestParseOptions(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-strategies", "upsert,bogus"},
		{"-scenarios", ""},
		{"-levels", "1,0"},
		{"-concurrency", "8,x"},
		{"-scale", "0"},
		{"-cooldown", "1s"}, // only over HTTP
		{"-label", "x"},
		{"-target", "http://127.0.0.1:1", "-strategies", "upsert"}, // in-process only
		{"-target", "http://127.0.0.1:1", "-scenarios", "seed,limits"},
		{"-target", "http://127.0.0.1:1", "-scenarios", "tiers"},
		{"-target", "http://127.0.0.1:1", "-audit"},
		{"-rounds", "-1"},
		{"-soak", "-1s"},
		{"-soak", "1m", "-scenarios", "seed"}, // the soak runs its own load
		{"-soak", "1m", "-database-url", "postgres://127.0.0.1/x"},
		{"extra"},
	} {
		if _, err := parseOptions(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	o, err := parseOptions([]string{"-strategies", "range-naive,upsert", "-database-url", "postgres://u:secret@h/db"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.variants) != 2 || o.variants[0].Name != "upsert" || o.variants[1] != naive {
		t.Errorf("variants %+v, want upsert then range-naive", o.variants)
	}
	if o, err := parseOptions([]string{"-concurrency", "8, 64"}, &bytes.Buffer{}); err != nil || !slices.Equal(o.concurrency, []int{8, 64}) ||
		o.variants[0] != peer {
		t.Errorf("defaults with -concurrency 8,64: %+v, %v; want the peer first and both levels", o, err)
	}
	if strings.Contains(o.command, "secret") {
		t.Errorf("the recorded command shows the database password: %s", o.command)
	}
}
