package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type testBundle struct {
	srv    *httptest.Server
	logs   *bytes.Buffer
	pool   *pgxpool.Pool
	schema string
}

// setup serves the demo over a fresh schema of the test server, or over
// pool when it is given (with the schema left unmigrated).
func setup(t *testing.T, pool *pgxpool.Pool, edit func(*config)) *testBundle {
	t.Helper()
	t.Parallel()
	cfg := config{
		strategy: pglimit.Upsert,
		cooldown: 1500 * time.Millisecond,
		schema:   "public",
		instance: "test",
		maxUsers: 10,

		itemsPerMinute: 5, itemsBurst: 3, itemsPerDay: 20,
		exportsAtOnce: 2, exportSlots: 8,
		searchOrgPerMinute: 60, searchUserPerMinute: 50,
		reportsPerMonth: 3, reportsHardCap: 4,
	}
	if pool == nil {
		pool = testdb.Pool(t)
		cfg.schema = testdb.Schema(t)
		if err := migrateDemo(context.Background(), pool, cfg.schema); err != nil {
			t.Fatal(err)
		}
	}
	if edit != nil {
		edit(&cfg)
	}
	var logs bytes.Buffer
	a, err := newApp(pool, cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.handler())
	t.Cleanup(srv.Close)
	return &testBundle{srv: srv, logs: &logs, pool: pool, schema: cfg.schema}
}

type response struct {
	code   int
	header http.Header
	body   []byte
}

func (b *testBundle) do(t *testing.T, method, path, body string) response {
	t.Helper()
	return b.doWith(t, method, path, body, nil)
}

// doWith is do with the request's header set to header's values too.
func (b *testBundle) doWith(t *testing.T, method, path, body string, header http.Header) response {
	t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, data}
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("status %d body %q: %v", r.code, r.body, err)
	}
	return v
}

// Two exports of a user run at once; a third is refused while they run,
// and another user's runs.
func TestExportsAtOnce(t *testing.T) {
	b := setup(t, nil, func(c *config) { c.exportTime = 2 * time.Second })
	if r := b.do(t, "POST", "/items", `{"user": "alice", "name": "first"}`); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	codes := make(chan int, 4)
	var wg sync.WaitGroup
	get := func(user string) {
		wg.Go(func() {
			resp, err := b.srv.Client().Get(b.srv.URL + "/exports/" + user)
			if err != nil {
				t.Error(err)
				codes <- 0
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && !strings.Contains(string(body), ",alice,first,") && user == "alice" {
				t.Errorf("alice's export: %q, want her item", body)
			}
			codes <- resp.StatusCode
		})
	}
	get("alice")
	get("alice")
	get("alice")
	get("bob")
	wg.Wait()
	close(codes)
	got := map[int]int{}
	for c := range codes {
		got[c]++
	}
	if got[http.StatusOK] != 3 || got[http.StatusTooManyRequests] != 1 {
		t.Fatalf("three exports of alice and one of bob at once: %v, want three 200 and one 429", got)
	}
}

// The fleet's export slots are shared fairly among organisations: with 2
// slots, organisation big asks for 4 exports at once and small, once
// two of big's wait, for 1. When big's first two end, small's export
// takes one of the slots (it holds none; big would hold two), ahead of
// big's last, and ends before it. Served in arrival order, it would end
// last.
func TestExportsFairPerOrganisation(t *testing.T) {
	b := setup(t, nil, func(c *config) { c.exportSlots, c.exportTime = 2, time.Second })
	type done struct {
		who  string
		code int
	}
	ended := make(chan done, 5)
	get := func(user, org string) {
		go func() {
			resp, err := b.srv.Client().Get(b.srv.URL + "/exports/" + user + "?org=" + org)
			if err != nil {
				t.Error(err)
				ended <- done{user, 0}
				return
			}
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			ended <- done{user, resp.StatusCode}
		}()
	}
	for i := range 4 {
		get(fmt.Sprintf("big-%d", i), "big")
	}
	q := fmt.Sprintf("SELECT count(*) FROM %s WHERE expires_at > clock_timestamp()", pgx.Identifier{b.schema, "pglimit_slot_waiters"}.Sanitize())
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var n int
		if err := b.pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of big's exports wait, want 2", n)
		}
	}
	get("small-0", "small")
	var order []string
	for range 5 {
		d := <-ended
		if d.code != http.StatusOK {
			t.Errorf("%s's export: %d, want 200", d.who, d.code)
		}
		order = append(order, d.who)
	}
	if order[4] == "small-0" {
		t.Errorf("exports ended in the order %v; small's should end before big's last", order)
	}
}

func TestCreateListAndCooldown(t *testing.T) {
	b := setup(t, nil, nil)

	r := b.do(t, "POST", "/items", `{"user": "alice", "name": "first"}`)
	if r.code != 201 || r.header.Get("Location") != "/items/alice" {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	if it := r.json(t); it["user"] != "alice" || it["name"] != "first" || it["id"] == nil {
		t.Fatalf("created item %v", it)
	}
	b.do(t, "POST", "/items", `{"user": "bob", "name": "not alice's"}`)

	r = b.do(t, "GET", "/items/alice", "")
	if r.code != 200 {
		t.Fatalf("list: %d %s", r.code, r.body)
	}
	items, _ := r.json(t)["items"].([]any)
	if len(items) != 1 {
		t.Fatalf("alice's items: %s", r.body)
	}
	if got := r.header.Get("RateLimit-Policy"); got != `"cooldown";q=1;w=2` {
		t.Fatalf("RateLimit-Policy %q", got)
	}
	if got := r.header.Get("RateLimit"); got != `"cooldown";r=0;t=2` {
		t.Fatalf("RateLimit on admission %q", got)
	}

	r = b.do(t, "GET", "/items/alice", "")
	if r.code != 429 || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("second list: %d %s", r.code, r.body)
	}
	retry, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || retry < 1 || retry > 2 {
		t.Fatalf("Retry-After %q, want 1 or 2 (1.5 s cooldown, rounded up)", r.header.Get("Retry-After"))
	}
	if got, want := r.header.Get("RateLimit"), `"cooldown";r=0;t=`+strconv.Itoa(retry); got != want {
		t.Fatalf("RateLimit on refusal %q, want %q", got, want)
	}
	if p := r.json(t); p["status"] != 429.0 {
		t.Fatalf("problem %v", p)
	}

	// Retry-After rounds up, so waiting for it always gets in.
	time.Sleep(time.Duration(retry) * time.Second)
	if r := b.do(t, "GET", "/items/alice", ""); r.code != 200 {
		t.Fatalf("after Retry-After: %d %s", r.code, r.body)
	}
}

// TestCreateLimits: POST /items is limited per user by two limits at once,
// advertised in the RateLimit headers; a malformed body consumes nothing.
func TestCreateLimits(t *testing.T) {
	for _, strategy := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait, pglimit.Range} {
		t.Run(string(strategy), func(t *testing.T) {
			b := setup(t, nil, func(c *config) { c.strategy = strategy; c.itemsPerDay = 4 })
			const policy = `"per-minute";q=5;w=60, "per-day";q=4;w=86400`
			create := func(user string) response {
				return b.do(t, "POST", "/items", `{"user": "`+user+`", "name": "x"}`)
			}
			if r := b.do(t, "POST", "/items", `{"user": "alice"}`); r.code != 400 {
				t.Fatalf("no name: %d %s", r.code, r.body)
			}
			for i, remaining := range []string{"2", "1", "0"} {
				r := create("alice")
				if r.code != 201 {
					t.Fatalf("create %d: %d %s", i, r.code, r.body)
				}
				if got := r.header.Get("RateLimit-Policy"); got != policy {
					t.Fatalf("create %d: RateLimit-Policy %s, want %s", i, got, policy)
				}
				if got := r.header.Get("RateLimit"); !strings.HasPrefix(got, `"per-minute";r=`+remaining+`;t=`) {
					t.Fatalf("create %d: RateLimit %s, want per-minute with %s left", i, got, remaining)
				}
			}
			// The burst of 3 is spent: the next is refused by the rate,
			// for about one emission interval (12 s).
			r := create("alice")
			if r.code != 429 {
				t.Fatalf("fourth create: %d %s", r.code, r.body)
			}
			if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 || ra > 12 {
				t.Fatalf("Retry-After %q, want 1 to 12", r.header.Get("Retry-After"))
			}
			if v, _ := r.json(t)["violated-policies"].([]any); len(v) != 1 || v[0] != "per-minute" {
				t.Fatalf("violated-policies %v, want [per-minute]", r.json(t)["violated-policies"])
			}
			// Another user has limits of their own; the list cooldown
			// is a limiter of its own too.
			if r := create("bob"); r.code != 201 {
				t.Fatalf("bob: %d %s", r.code, r.body)
			}
			if r := b.do(t, "GET", "/items/alice", ""); r.code != 200 || r.header.Get("RateLimit-Policy") != `"cooldown";q=1;w=2` {
				t.Fatalf("list: %d %s", r.code, r.header.Get("RateLimit-Policy"))
			}
			var n int
			if err := b.pool.QueryRow(context.Background(),
				`SELECT count(*) FROM `+pgx.Identifier{b.schema, "demo_items"}.Sanitize()+` WHERE user_name = 'alice'`).Scan(&n); err != nil || n != 3 {
				t.Fatalf("alice has %d items (%v), want 3", n, err)
			}
		})
	}
}

// TestCreateDailyQuota: the daily quota refuses once it is spent, even
// with the rate's burst left, and the refusal names it.
func TestCreateDailyQuota(t *testing.T) {
	b := setup(t, nil, func(c *config) { c.itemsPerDay = 2 })
	for i := range 2 {
		if r := b.do(t, "POST", "/items", `{"user": "carol", "name": "x"}`); r.code != 201 {
			t.Fatalf("create %d: %d %s", i, r.code, r.body)
		}
	}
	r := b.do(t, "POST", "/items", `{"user": "carol", "name": "x"}`)
	if r.code != 429 {
		t.Fatalf("third create: %d %s", r.code, r.body)
	}
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 86000 || ra > 86400 {
		t.Fatalf("Retry-After %q, want about a day", r.header.Get("Retry-After"))
	}
	if got := r.header.Get("RateLimit"); !strings.HasPrefix(got, `"per-day";r=0;t=`) {
		t.Fatalf("RateLimit %s, want the per-day limit", got)
	}
	if v, _ := r.json(t)["violated-policies"].([]any); len(v) != 1 || v[0] != "per-day" {
		t.Fatalf("violated-policies %v, want [per-day]", r.json(t)["violated-policies"])
	}
}

func TestCreateValidation(t *testing.T) {
	b := setup(t, nil, nil)
	for _, tt := range []struct {
		name, body string
		code       int
	}{
		{"bad json", `{"user": "alice",`, 400},
		{"not an object", `["alice"]`, 400},
		{"two values", `{"user": "a", "name": "b"} {}`, 400},
		{"unknown field", `{"user": "a", "name": "b", "admin": true}`, 400},
		{"empty body", ``, 400},
		{"missing user", `{"name": "b"}`, 400},
		{"missing name", `{"user": "a"}`, 400},
		{"user too long", `{"user": "` + strings.Repeat("u", maxUserBytes+1) + `", "name": "b"}`, 400},
		{"name too long", `{"user": "a", "name": "` + strings.Repeat("n", maxNameBytes+1) + `"}`, 400},
		{"nul in user", `{"user": "a\u0000b", "name": "b"}`, 400},
		{"nul in name", `{"user": "a", "name": "b\u0000"}`, 400},
		{"body over the limit", `{"user": "a", "name": "` + strings.Repeat("n", maxBodyBytes) + `"}`, 413},
		{"longest valid", `{"user": "` + strings.Repeat("u", maxUserBytes) + `", "name": "` + strings.Repeat("n", maxNameBytes) + `"}`, 201},
	} {
		r := b.do(t, "POST", "/items", tt.body)
		if r.code != tt.code {
			t.Errorf("%s: %d %s, want %d", tt.name, r.code, r.body, tt.code)
			continue
		}
		if tt.code >= 400 {
			if p := r.json(t); p["status"] != float64(tt.code) || p["detail"] == "" {
				t.Errorf("%s: problem %v", tt.name, p)
			}
		}
	}

	for _, tt := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/nope", 404},
		{"DELETE", "/items/alice", 405},
		{"GET", "/items", 405},
		{"GET", "/items/%ff", 400}, // not UTF-8: refused before the limiter
		{"GET", "/healthz", 200},
		{"GET", "/readyz", 200},
	} {
		if r := b.do(t, tt.method, tt.path, ""); r.code != tt.code {
			t.Errorf("%s %s: %d %s, want %d", tt.method, tt.path, r.code, r.body, tt.code)
		}
	}
}

func TestDatabaseDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+addr+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, tt := range []struct {
		policy  pglimithttp.ErrorPolicy
		code    int
		outcome pglimithttp.Outcome
	}{
		// Fail-open reaches the handler, whose own query fails: 500.
		{pglimithttp.FailOpen, 500, pglimithttp.OutcomeFailOpen},
		{pglimithttp.FailClosed, 429, pglimithttp.OutcomeFailClosed},
		{pglimithttp.Unavailable, 503, pglimithttp.OutcomeUnavailable},
	} {
		t.Run(tt.policy.String(), func(t *testing.T) {
			b := setup(t, pool, func(c *config) { c.onError = tt.policy })
			start := time.Now()
			if r := b.do(t, "GET", "/items/alice", ""); r.code != tt.code {
				t.Fatalf("list: %d %s, want %d", r.code, r.body, tt.code)
			}
			if elapsed := time.Since(start); elapsed > 5*time.Second {
				t.Fatalf("answered after %s", elapsed)
			}
			if r := b.do(t, "GET", "/readyz", ""); r.code != 503 {
				t.Fatalf("readyz: %d, want 503", r.code)
			}
			if r := b.do(t, "GET", "/healthz", ""); r.code != 200 {
				t.Fatalf("healthz: %d, want 200", r.code)
			}
			if !strings.Contains(b.logs.String(), "limiter failed") {
				t.Fatalf("no log line for the failure:\n%s", b.logs)
			}
			want := `demo_limiter_failures_total{outcome="` + string(tt.outcome) + `"} 1`
			if r := b.do(t, "GET", "/metrics", ""); !strings.Contains(string(r.body), want) {
				t.Fatalf("metrics lack %s", want)
			}
		})
	}
}

// A client that hangs up while its request waits for the limiter is no
// limiter failure: no failure counted or logged, no limiter error, a
// "canceled" decision instead.
func TestClientGoneIsNotALimiterFailure(t *testing.T) {
	b := setup(t, nil, nil)
	ctx := context.Background()
	// Make the decision wait: the limiter's table is locked against writes.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{b.schema, "pglimit_upsert"}.Sanitize()+" IN EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}

	reqCtx, hangUp := context.WithCancel(ctx)
	defer hangUp()
	req, err := http.NewRequestWithContext(reqCtx, "GET", b.srv.URL+"/items/alice", nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := b.srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	// Hang up once the decision waits for the lock.
	testdb.WaitsForLock(t, b.pool, "pglimit_upsert", 30*time.Second)
	hangUp()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v, want context.Canceled", err)
	}
	// The server notices the hang-up and the decision ends soon after.
	const (
		canceled = `pglimit_decisions_total{limiter="list-items",outcome="canceled",strategy="upsert"} 1`
		failed   = `pglimit_decisions_total{limiter="list-items",outcome="error",strategy="upsert"} 1`
	)
	var metrics string
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(metrics, canceled) && !strings.Contains(metrics, failed); {
		if time.Now().After(deadline) {
			t.Fatal("the decision was never counted")
		}
		time.Sleep(10 * time.Millisecond)
		metrics = string(b.do(t, "GET", "/metrics", "").body)
	}
	if !strings.Contains(metrics, canceled) {
		t.Errorf("metrics lack %s", canceled)
	}
	for _, bad := range []string{`demo_limiter_failures_total{`, failed, `kind="canceled"`} {
		if strings.Contains(metrics, bad) {
			t.Errorf("metrics count the hang-up as a failure: %s", bad)
		}
	}
	if strings.Contains(b.logs.String(), "limiter failed") {
		t.Errorf("the hang-up was logged as a limiter failure:\n%s", b.logs)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	b := setup(t, nil, func(c *config) { c.strategy = pglimit.Range })
	b.do(t, "POST", "/items", `{"user": "alice", "name": "x"}`)
	b.do(t, "GET", "/items/alice", "")
	b.do(t, "GET", "/items/alice", "")
	b.do(t, "GET", "/nope", "")
	r := b.do(t, "GET", "/metrics", "")
	if r.code != 200 {
		t.Fatalf("metrics: %d", r.code)
	}
	for _, want := range []string{
		`pglimit_decisions_total{limiter="list-items",outcome="admitted",strategy="range"} 1`,
		`pglimit_decisions_total{limiter="list-items",outcome="refused",strategy="range"} 1`,
		`pglimit_decision_duration_seconds_bucket{limiter="list-items",outcome="refused",strategy="range",le="+Inf"} 1`,
		`pglimit_key_decisions_total{key="alice",limiter="list-items",outcome="refused",strategy="range"} 1`,
		// Range enforces only a cooldown: the item limits use upsert.
		`pglimit_decisions_total{limiter="create-item",outcome="admitted",strategy="upsert"} 1`,
		`pglimit_key_decisions_total{key="alice",limiter="create-item",outcome="admitted",strategy="upsert"} 1`,
		`pglimit_pool_max_connections{pool="demo"}`,
		`demo_http_requests_total{code="429",route="GET /items/{user}"} 1`,
		`demo_http_requests_total{code="201",route="POST /items"} 1`,
		`demo_http_requests_total{code="404",route="unmatched"} 1`,
		`demo_http_request_duration_seconds_count{route="GET /items/{user}"} 2`,
		`demo_item_events_total{event="created",user="alice"} 1`,
		`demo_item_events_total{event="listed",user="alice"} 1`,
		`demo_info{name="test",strategy="range"} 1`,
		`demo_cooldown_seconds 1.5`,
	} {
		if !bytes.Contains(r.body, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// A search is admitted on an estimate at its organisation's and its user's
// limits at once, and settled with the items it found: a search that
// finds 30 costs 30 at both levels, into their debt, and the next search
// is refused by whichever level then owes; a query it cannot run is
// refused before the limits count it.
func TestSearchSettles(t *testing.T) {
	b := setup(t, nil, nil)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{b.schema, "demo_items"}.Sanitize()+
		` (user_name, name) SELECT 'bob', 'match-' || i FROM generate_series(1, 30) AS i`); err != nil {
		t.Fatal(err)
	}
	search := func(org, user, q string, want int) response {
		t.Helper()
		r := b.do(t, "GET", "/search/"+org+"/"+user+"?q="+url.QueryEscape(q), "")
		if r.code != want {
			t.Fatalf("%s/%s searching %q: %d %s, want %d", org, user, q, r.code, r.body, want)
		}
		return r
	}
	if got := search("acme", "bob", "match", 200).json(t)["cost"]; got != float64(30) {
		t.Fatalf("a search that found 30 items: cost %v", got)
	}
	if got := search("acme", "bob", "match", 200).header.Get("RateLimit-Policy"); got != `"org-items";q=60;w=60, "user-items";q=50;w=60` {
		t.Fatalf("RateLimit-Policy %s", got)
	}
	// 60 of the org's 60 used, and 60 of bob's 50: the org refuses
	// carol, and bob owes.
	if v := search("acme", "carol", "nothing", 429).json(t)["violated-policies"]; fmt.Sprint(v) != "[org-items]" {
		t.Fatalf("carol in a spent org: violated-policies %v", v)
	}
	if v := search("acme", "bob", "nothing", 429).json(t)["violated-policies"]; fmt.Sprint(v) != "[org-items user-items]" {
		t.Fatalf("bob, in debt in a spent org: violated-policies %v", v)
	}
	search("beta", "dave", "", 400)
	search("beta", "dave", "nul\x00", 400)
	if got := search("beta", "dave", "nothing", 200).json(t)["cost"]; got != float64(1) {
		t.Fatalf("a search that found nothing: cost %v, want 1", got)
	}
	_, userLimits := config{searchOrgPerMinute: 60, searchUserPerMinute: 50}.searchLimits()
	st, err := pglimit.Inspect(ctx, testdb.Limiter(t, b.pool, &pglimit.Config{Schema: b.schema, Namespace: "search-user", Limits: userLimits}), "beta/dave")
	if err != nil || st.Limits[0].Remaining != 49 {
		t.Fatalf("dave after two refused queries and a search that cost 1: %+v, %v; want 49 left", st, err)
	}
}
