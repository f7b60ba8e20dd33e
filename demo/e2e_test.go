package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
)

// The end-to-end test runs what docker-compose.yml runs, minus Docker and
// Grafana: two demo processes on one database, a real Prometheus scraping
// both, load with admissions, refusals, bad requests and database errors,
// the cleanup job deleting the rows the load left; then every PromQL
// expression of both Grafana dashboards, the demo's and the library's,
// must return data.

const (
	demoDashboard    = "../grafana/dashboards/demo.json"
	libraryDashboard = "../grafana/dashboards/pglimit.json"
	alertsFile       = "../prometheus/alerts.yml"
	e2eCooldown      = time.Second

	// Rows expire e2eCooldown after their admission and are deleted at the
	// next run after the retention, so cleanup runs delete rows during the
	// test.
	e2eCleanupInterval  = 500 * time.Millisecond
	e2eCleanupRetention = 200 * time.Millisecond
)

// lookPath finds a tool the test needs or fails saying how to install it:
// a missing tool must never turn into a silent skip.
func lookPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testdb.Missing(t, "%s not found on PATH: apt-get install prometheus (Debian's package has prometheus and promtool)", name)
	}
	return p
}

// goCommand is the go command running the tests: go test puts its
// GOROOT/bin first on the PATH of the test binary.
func goCommand(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not found on PATH, which go test prepends with its GOROOT/bin: %v", err)
	}
	return p
}

func TestPrometheusFiles(t *testing.T) {
	t.Parallel()
	promtool := lookPath(t, "promtool")
	for _, args := range [][]string{
		{"check", "config", "../prometheus/prometheus.yml"},
		{"check", "rules", alertsFile},
		{"test", "rules", "../prometheus/alerts_test.yml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func TestEndToEnd(t *testing.T) {
	testdb.Slow(t)
	t.Parallel()
	promBin := lookPath(t, "prometheus")
	start := time.Now()
	bin := buildDemo(t)
	t.Logf("built the demo in %s", time.Since(start).Round(time.Millisecond))

	dbURL := testdb.URL(t)
	schema := testdb.Schema(t)
	var demos []*process
	for i := 1; i <= 2; i++ {
		demos = append(demos, startDemo(t, bin, fmt.Sprintf("e2e-%d", i), dbURL, schema))
	}
	for _, d := range demos {
		d.waitReady(t)
	}
	prom := startPrometheus(t, promBin, demos)
	// Its first scrape comes up to 5 s after start (target discovery is
	// throttled); load sent earlier would show in no rate.
	prom.waitFor(t, `up == 1`, len(demos))

	st := driveLoad(t, demos)
	t.Logf("load: %v", st.codes)
	for _, want := range []int{200, 201, 400, 404, 429} {
		if st.codes[want] == 0 {
			t.Errorf("the load produced no %d response: %v", want, st.codes)
		}
	}
	st.checkCooldown(t)
	st.checkItems(t)
	produceErrors(t, demos)
	// The load's rows expire within a cooldown of its end; the leader
	// deletes them at its next run.
	prom.waitFor(t, `sum(pglimit_cleanup_rows_deleted_total) > 0`, 1)
	prom.waitFor(t, `pglimit_cleanup_last_success_timestamp_seconds > 0`, 1)
	if v, err := prom.query(`pglimit_cleanup_rows_deleted_total`); err == nil {
		for _, s := range v {
			t.Logf("cleanup: %s deleted %v rows", s.Metric["job"], s.Value[1])
		}
	}

	// Every series, including the error counter that exists only after an
	// error, needs two samples for rate().
	prom.waitScrapedAfter(t, time.Now().Add(2*time.Second))
	if v, err := prom.query(`sum by (kind) (pglimit_errors_total)`); err == nil {
		for _, s := range v {
			t.Logf("limiter errors of kind %s: %v", s.Metric["kind"], s.Value[1])
		}
	}
	// The original's 12 panels, and the library's 11 (one row each).
	checkDashboard(t, prom, demoDashboard, "Monitoring RateLimiter", 12)
	checkDashboard(t, prom, libraryDashboard, "pglimit", 11)
	prom.checkRules(t)

	for _, d := range demos {
		d.stop(t)
	}
	t.Logf("end to end in %s", time.Since(start).Round(time.Millisecond))
}

func buildDemo(t *testing.T) string {
	t.Helper()
	goBin := goCommand(t)
	bin := filepath.Join(t.TempDir(), "demo")
	args := []string{"build", "-o", bin}
	// Built like this test binary, the demo reuses its compiled packages
	// (a cold build of the dependencies takes a minute on CI), and under
	// -race the two demo processes are race-checked too.
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" && s.Value == "true" {
				args = append(args, "-race")
			}
		}
	}
	cmd := exec.Command(goBin, append(args, ".")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// process is a child process whose output is kept for failure messages.
type process struct {
	name string
	cmd  *exec.Cmd
	addr string // host:port it serves on

	mu     sync.Mutex
	output strings.Builder
	exited chan struct{}
}

func (p *process) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.output.String()
}

// startProcess runs cmd, collects its output, and calls onLine for each line.
func startProcess(t *testing.T, name string, cmd *exec.Cmd, onLine func(string)) *process {
	t.Helper()
	p := &process{name: name, cmd: cmd, exited: make(chan struct{})}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL // never outlive a killed test
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	var readDone sync.WaitGroup
	readDone.Go(func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.output.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if onLine != nil {
				onLine(sc.Text())
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	})
	go func() {
		_ = cmd.Wait()
		pw.Close()
		readDone.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		_ = cmd.Process.Kill()
		<-p.exited
	})
	return p
}

var listeningRE = regexp.MustCompile(`msg=listening .*addr=(\S+)`)

func startDemo(t *testing.T, bin, name, dbURL, schema string) *process {
	t.Helper()
	addrc := make(chan string, 1)
	cmd := exec.Command(bin,
		"-addr", "127.0.0.1:0",
		"-database-url", dbURL,
		"-schema", schema,
		"-cooldown", e2eCooldown.String(),
		"-instance", name,
		"-metrics-max-users", "20",
		"-cleanup-interval", e2eCleanupInterval.String(),
		"-cleanup-retention", e2eCleanupRetention.String(),
	)
	cmd.Env = append(os.Environ(), "DATABASE_URL=") // only the flag counts
	p := startProcess(t, name, cmd, func(line string) {
		if m := listeningRE.FindStringSubmatch(line); m != nil {
			select {
			case addrc <- m[1]:
			default:
			}
		}
	})
	select {
	case p.addr = <-addrc:
	case <-p.exited:
		t.Fatalf("%s exited at start:\n%s", name, p.log())
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not listening after 30s:\n%s", name, p.log())
	}
	return p
}

func (p *process) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + p.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready: %v\n%s", p.name, err, p.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop asks for a graceful shutdown and expects a clean exit.
func (p *process) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("%s did not stop within 15s of SIGTERM:\n%s", p.name, p.log())
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("%s exited with %d after SIGTERM:\n%s", p.name, code, p.log())
	}
}

// promServer is a running Prometheus and its HTTP API.
type promServer struct {
	*process
	base string
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func startPrometheus(t *testing.T, bin string, demos []*process) *promServer {
	t.Helper()
	dir := t.TempDir()
	alerts, err := filepath.Abs(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - %q\nscrape_configs:\n", alerts)
	for i, d := range demos {
		fmt.Fprintf(&cfg, "  - job_name: demo-%d\n    static_configs:\n      - targets: [%q]\n", i+1, d.addr)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	p := startProcess(t, "prometheus", exec.Command(bin,
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn",
	), nil)
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
		}
	})
	prom := &promServer{process: p, base: "http://" + addr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(prom.base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return prom
			}
		}
		select {
		case <-p.exited:
			t.Fatalf("prometheus exited at start:\n%s", p.log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30s: %v\n%s", err, p.log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query runs an instant query and returns the vector, or the error the API
// gave.
func (p *promServer) query(expr string) ([]sample, error) {
	resp, err := http.Get(p.base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("%s", body.Error)
	}
	if body.Data.ResultType != "vector" {
		return nil, fmt.Errorf("result type %s, want vector", body.Data.ResultType)
	}
	var v []sample
	if err := json.Unmarshal(body.Data.Result, &v); err != nil {
		return nil, err
	}
	return v, nil
}

// waitFor waits until expr has at least n series.
func (p *promServer) waitFor(t *testing.T, expr string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := p.query(expr)
		if err == nil && len(v) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d series (%v) after 20s, want %d\n%s", expr, len(v), err, n, p.log())
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitScrapedAfter waits until every target has been scraped after when.
func (p *promServer) waitScrapedAfter(t *testing.T, when time.Time) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := p.query(`min(timestamp(up))`)
		if err == nil && len(v) == 1 {
			if s, ok := v[0].Value[1].(string); ok {
				var ts float64
				if _, err := fmt.Sscan(s, &ts); err == nil && ts > float64(when.UnixMilli())/1000 {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("targets not scraped after %s: %v %v\n%s", when.Format(time.TimeOnly), v, err, p.log())
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// checkRules expects every alert rule to evaluate without error.
func (p *promServer) checkRules(t *testing.T) {
	t.Helper()
	resp, err := http.Get(p.base + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range body.Data.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health == "err" {
				t.Errorf("alert %s: %s", r.Name, r.LastError)
			}
		}
	}
	if n == 0 {
		t.Errorf("Prometheus loaded no alert rules from %s", alertsFile)
	}
}

// loadStats is what the load saw.
type loadStats struct {
	mu       sync.Mutex
	codes    map[int]int
	admitted map[string][]window // per user, GETs answered 200
	created  map[string]int      // per user, POSTs answered 201
	took     time.Duration       // how long the load ran
}

// window is when a request was in flight; its decision happened inside.
type window struct{ sent, received time.Time }

func (s *loadStats) record(code int, user string, w window) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.codes[code]++
	switch {
	case user != "" && code == 200:
		s.admitted[user] = append(s.admitted[user], w)
	case user != "" && code == 201:
		s.created[user]++
	}
}

// checkItems proves that the item limits held across the two instances:
// GCRA admits at most Burst + Rate*w/Period in any interval w (3 + 5 per
// minute), and liveness: every user got its burst.
func (s *loadStats) checkItems(t *testing.T) {
	t.Helper()
	most := 3 + int(s.took*5/time.Minute)
	for user, n := range s.created {
		if n < 3 || n > most {
			t.Errorf("user %s created %d items in %s; want 3 to %d (burst 3, 5 per minute)", user, n, s.took, most)
		}
	}
	if len(s.created) != 4 {
		t.Errorf("%d users created items, want 4: %v", len(s.created), s.created)
	}
}

// checkCooldown proves no over-admission across the two instances from
// the client's side: admissions at database times t1 < t2 need t2-t1 >= C,
// and sent1 <= t1, t2 <= received2, so received2 - sent1 >= C.
func (s *loadStats) checkCooldown(t *testing.T) {
	t.Helper()
	for user, ws := range s.admitted {
		slices.SortFunc(ws, func(a, b window) int { return a.received.Compare(b.received) })
		for i := 1; i < len(ws); i++ {
			if gap := ws[i].received.Sub(ws[i-1].sent); gap < e2eCooldown {
				t.Errorf("user %s admitted twice within %s (cooldown %s)", user, gap, e2eCooldown)
			}
		}
	}
}

func driveLoad(t *testing.T, demos []*process) *loadStats {
	t.Helper()
	st := &loadStats{codes: map[int]int{}, admitted: map[string][]window{}, created: map[string]int{}}
	began := time.Now()
	client := &http.Client{Timeout: 10 * time.Second}
	send := func(method, url, body, user string) {
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return
		}
		w := window{sent: time.Now()}
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("%s %s: %v", method, url, err)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		w.received = time.Now()
		st.record(resp.StatusCode, user, w)
	}

	// Each user hammers both instances for a few cooldowns.
	const loadFor = 3*e2eCooldown + 500*time.Millisecond
	var wg sync.WaitGroup
	for u := range 4 {
		user := fmt.Sprintf("user-%d", u)
		wg.Go(func() {
			for i := 0; ; i++ {
				if time.Duration(i)*50*time.Millisecond > loadFor {
					return
				}
				d := demos[(i+u)%len(demos)]
				send("GET", "http://"+d.addr+"/items/"+user, "", user)
				if i%10 == 0 {
					send("POST", "http://"+d.addr+"/items", fmt.Sprintf(`{"user": %q, "name": "item %d"}`, user, i), user)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	// Three exports of one user at once over both instances: its two slots
	// are shared, so exactly one is refused. Counted apart, so that the
	// cooldown's own 429s stay checked.
	exports := make(chan int, 3)
	for i := range cap(exports) {
		wg.Go(func() {
			resp, err := client.Get("http://" + demos[i%len(demos)].addr + "/exports/exporter")
			if err != nil {
				t.Errorf("export: %v", err)
				exports <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			exports <- resp.StatusCode
		})
	}
	for _, d := range demos {
		send("POST", "http://"+d.addr+"/items", `{"user": `, "")
		send("GET", "http://"+d.addr+"/nope", "", "")
	}
	wg.Wait()
	st.took = time.Since(began)
	close(exports)
	got := map[int]int{}
	for c := range exports {
		got[c]++
	}
	if got[http.StatusOK] != 2 || got[http.StatusTooManyRequests] != 1 {
		t.Errorf("three exports of one user at once: %v, want two 200 and one 429", got)
	}
	return st
}

// produceErrors terminates the demos' database sessions while requests
// flow, until each demo has counted a limiter error (a 57P01 or a lost
// connection, depending on timing).
func produceErrors(t *testing.T, demos []*process) {
	t.Helper()
	admin := testdb.Pool(t)
	ctx := context.Background()
	for _, d := range demos {
		deadline := time.Now().Add(20 * time.Second)
		for n := 0; !hasErrors(t, d); n++ {
			if time.Now().After(deadline) {
				t.Fatalf("%s counted no limiter error after %d rounds of pg_terminate_backend:\n%s", d.name, n, d.log())
			}
			// Busy connections: idle ones are checked by the pool before use.
			burst(d, n)
			_, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, "pglimit-demo/"+d.name)
			if err != nil {
				t.Fatal(err)
			}
			burst(d, n)
		}
	}
}

// burst sends concurrent requests for new users, which all reach the limiter.
func burst(d *process, round int) {
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			resp, err := http.Get(fmt.Sprintf("http://%s/items/err-%d-%d", d.addr, round, i))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

func hasErrors(t *testing.T, d *process) bool {
	t.Helper()
	resp, err := http.Get("http://" + d.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), "pglimit_errors_total{")
}

// Grafana's variables, as the e2e test fills them in: every instance and
// strategy, a rate window of many 1 s scrapes, a range covering the test.
var grafanaVars = map[string]string{
	"__rate_interval": "30s",
	"__interval":      "1s",
	"__range":         "5m",
	"job":             ".+",
	"instance":        ".+",
	"strategy":        ".+",
	"limiter":         ".+",
}

var grafanaVarRE = regexp.MustCompile(`\$\{?(\w+)(?::\w+)?\}?`)

// expandVars replaces Grafana variables; it fails on one it does not know,
// so a new variable in the dashboard cannot slip past the check.
func expandVars(expr string) (string, error) {
	var unknown []string
	out := grafanaVarRE.ReplaceAllStringFunc(expr, func(m string) string {
		name := grafanaVarRE.FindStringSubmatch(m)[1]
		v, ok := grafanaVars[name]
		if !ok {
			unknown = append(unknown, m)
		}
		return v
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown Grafana variables %v", unknown)
	}
	return out, nil
}

type dashboardQuery struct {
	where, expr string
}

// dashboardQueries lists every PromQL expression of the dashboard: panel
// targets (rows included) and template variable queries, whose
// label_values(m, l) becomes a query for m.
func dashboardQueries(t *testing.T, file, title string) []dashboardQuery {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string  `json:"title"`
		Panels  []panel `json:"panels"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	}
	var dash struct {
		Title      string  `json:"title"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if dash.Title != title {
		t.Errorf("%s: dashboard title %q, want %q", file, dash.Title, title)
	}
	var qs []dashboardQuery
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				qs = append(qs, dashboardQuery{fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`)
	for _, v := range dash.Templating.List {
		if v.Type == "datasource" { // names a data source, queries nothing
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			_ = json.Unmarshal(v.Query, &q.Query) // older dashboards store a plain string
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, q.Query)
			continue
		}
		qs = append(qs, dashboardQuery{"variable " + v.Name, m[1]})
	}
	return qs
}

func checkDashboard(t *testing.T, prom *promServer, file, title string, minPanelQueries int) {
	t.Helper()
	qs := dashboardQueries(t, file, title)
	panels := 0
	for _, q := range qs {
		if strings.HasPrefix(q.where, "panel") {
			panels++
		}
		if strings.TrimSpace(q.expr) == "" {
			t.Errorf("%s: %s: empty expression", file, q.where)
			continue
		}
		expr, err := expandVars(q.expr)
		if err != nil {
			t.Errorf("%s: %s: %v", file, q.where, err)
			continue
		}
		v, err := prom.query(expr)
		switch {
		case err != nil:
			t.Errorf("%s: %s: %v\n  %s", file, q.where, err, expr)
		case len(v) == 0:
			t.Errorf("%s: %s: no series\n  %s", file, q.where, expr)
		}
	}
	if panels < minPanelQueries {
		t.Errorf("%s has %d panel queries, want at least %d", file, panels, minPanelQueries)
	}
	t.Logf("%s: %d dashboard queries evaluated against Prometheus", file, len(qs))
}
