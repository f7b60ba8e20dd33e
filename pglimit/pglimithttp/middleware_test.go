package pglimithttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// countingLimiter counts the calls that reach the real limiter.
type countingLimiter struct {
	pglimit.Limiter
	calls atomic.Int64
}

func (c *countingLimiter) AllowN(ctx context.Context, key string, n int) (pglimit.Decision, error) {
	c.calls.Add(1)
	return c.Limiter.AllowN(ctx, key, n)
}

type testBundle struct {
	lim *countingLimiter

	mu     sync.Mutex
	events []pglimithttp.Event
}

func (b *testBundle) lastEvent(t *testing.T) pglimithttp.Event {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.events) == 0 {
		t.Fatal("no OnDecision event")
	}
	return b.events[len(b.events)-1]
}

// setup serves "GET /items/{user}" through the middleware over a limiter on
// db (a fresh schema on the test server when nil).
func setup(t *testing.T, db *pgxpool.Pool, cfg pglimithttp.Config, limCfg pglimit.Config) (http.Handler, *testBundle) {
	t.Helper()
	if db == nil {
		db = testdb.Pool(t)
		limCfg.Schema = testdb.Schema(t)
	}
	lim, err := pglimit.New(db, &limCfg)
	if err != nil {
		t.Fatal(err)
	}
	b := &testBundle{lim: &countingLimiter{Limiter: lim}}
	if cfg.KeyFunc == nil {
		cfg.KeyFunc = pglimithttp.FromPathValue("user")
	}
	cfg.OnDecision = func(_ *http.Request, ev pglimithttp.Event) {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.events = append(b.events, ev)
	}
	mw, err := pglimithttp.Middleware(b.lim, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /items/{user}", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s, ok := r.Context().Value(probeKey{}).(*seen); ok {
			s.d, s.ok = pglimithttp.DecisionFrom(r.Context())
		}
		fmt.Fprintf(w, "items of %s\n", r.PathValue("user"))
	})))
	return mux, b
}

func get(t *testing.T, h http.Handler, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec
}

type problemBody struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	ViolatedPolicies []string `json:"violated-policies"`
}

func decodeProblem(t *testing.T, rec *httptest.ResponseRecorder, status int) problemBody {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p problemBody
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", rec.Body, err)
	}
	if p.Status != status || p.Title == "" || p.Type == "" {
		t.Fatalf("problem body %+v", p)
	}
	return p
}

func ceilSeconds(d time.Duration) int {
	return int((d + time.Second - 1) / time.Second)
}

func TestAdmitRefuseAdmit(t *testing.T) {
	t.Parallel()
	// 1.5 s: the advertised window rounds up to 2 and Retry-After can be
	// seen rounding up too.
	h, b := setup(t, nil, pglimithttp.Config{}, pglimit.Config{Cooldown: 1500 * time.Millisecond})

	rec := get(t, h, "/items/alice")
	if rec.Code != 200 || rec.Body.String() != "items of alice\n" {
		t.Fatalf("first call: %d %q", rec.Code, rec.Body)
	}
	if got := rec.Header().Get("RateLimit-Policy"); got != `"cooldown";q=1;w=2` {
		t.Fatalf("RateLimit-Policy %q", got)
	}
	if got := rec.Header().Get("RateLimit"); got != `"cooldown";r=0;t=2` {
		t.Fatalf("admission RateLimit %q", got)
	}
	if rec.Header().Get("Retry-After") != "" {
		t.Fatalf("Retry-After on an admission: %q", rec.Header().Get("Retry-After"))
	}

	rec = get(t, h, "/items/alice")
	ev := b.lastEvent(t)
	p := decodeProblem(t, rec, 429)
	if ev.Outcome != pglimithttp.OutcomeRefused || ev.Key != "alice" {
		t.Fatalf("event %+v", ev)
	}
	want := ceilSeconds(ev.Decision.RetryAfter)
	if want < 1 || want > 2 {
		t.Fatalf("RetryAfter %s outside (0, 1.5s]", ev.Decision.RetryAfter)
	}
	if got := rec.Header().Get("Retry-After"); got != strconv.Itoa(want) {
		t.Fatalf("Retry-After %q, want %d (RetryAfter %s rounded up)", got, want, ev.Decision.RetryAfter)
	}
	if got := rec.Header().Get("RateLimit"); got != fmt.Sprintf(`"cooldown";r=0;t=%d`, want) {
		t.Fatalf("refusal RateLimit %q", got)
	}
	if got := rec.Header().Get("RateLimit-Policy"); got != `"cooldown";q=1;w=2` {
		t.Fatalf("refusal RateLimit-Policy %q", got)
	}
	if !strings.HasSuffix(p.Type, "#quota-exceeded") || len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "cooldown" {
		t.Fatalf("problem %+v", p)
	}

	if rec := get(t, h, "/items/bob"); rec.Code != 200 {
		t.Fatalf("another key: %d, want 200", rec.Code)
	}

	time.Sleep(ev.Decision.RetryAfter + 50*time.Millisecond)
	if rec := get(t, h, "/items/alice"); rec.Code != 200 {
		t.Fatalf("after the cooldown: %d %s, want 200", rec.Code, rec.Body)
	}
}

func TestBadKeysNeverReachTheDatabase(t *testing.T) {
	t.Parallel()
	h, b := setup(t, nil, pglimithttp.Config{}, pglimit.Config{Cooldown: time.Minute})
	for name, path := range map[string]string{
		"invalid utf-8": "/items/%ff",
		"nul byte":      "/items/a%00b",
		"too long":      "/items/" + strings.Repeat("k", pglimit.MaxKeyLength+1),
	} {
		rec := get(t, h, path)
		decodeProblem(t, rec, 400)
		if ev := b.lastEvent(t); ev.Outcome != pglimithttp.OutcomeBadKey || !errors.Is(ev.Err, pglimit.ErrInvalidKey) {
			t.Errorf("%s: event %+v", name, ev)
		}
	}

	hdr, hb := setup(t, nil, pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User")}, pglimit.Config{Cooldown: time.Minute})
	rec := get(t, hdr, "/items/x")
	decodeProblem(t, rec, 400)
	if n := b.lim.calls.Load() + hb.lim.calls.Load(); n != 0 {
		t.Fatalf("%d bad keys reached the limiter", n)
	}
}

func TestSpoofedForwardedForIgnored(t *testing.T) {
	t.Parallel()
	kf, err := pglimithttp.RemoteIP(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := setup(t, nil, pglimithttp.Config{KeyFunc: kf}, pglimit.Config{Cooldown: time.Minute})
	send := func(xff string) int {
		r := httptest.NewRequest("GET", "/items/x", nil)
		r.RemoteAddr = "192.0.2.10:4000"
		r.Header.Set("X-Forwarded-For", xff)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	if code := send("198.51.100.1"); code != 200 {
		t.Fatalf("first: %d", code)
	}
	if code := send("198.51.100.2"); code != 429 {
		t.Fatalf("same peer, new X-Forwarded-For: %d, want 429", code)
	}
}

// deadPool is a pool whose server refuses connections.
func deadPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return newPool(t, "postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=5")
}

// silentPool is a pool whose server accepts connections and never answers,
// the hardest case for a bound.
func silentPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return newPool(t, "postgres://postgres@"+l.Addr().String()+"/postgres?sslmode=disable")
}

func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url) // lazy: connects on first use
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func TestDatabaseDown(t *testing.T) {
	t.Parallel()
	const bound = 5 * time.Second // catches a hang, not a slow machine
	for _, tt := range []struct {
		policy  pglimithttp.ErrorPolicy
		code    int
		outcome pglimithttp.Outcome
	}{
		{pglimithttp.Unavailable, 503, pglimithttp.OutcomeUnavailable},
		{pglimithttp.FailOpen, 200, pglimithttp.OutcomeFailOpen},
		{pglimithttp.FailClosed, 429, pglimithttp.OutcomeFailClosed},
	} {
		for name, pool := range map[string]func(*testing.T) *pgxpool.Pool{"refused": deadPool, "silent": silentPool} {
			t.Run(tt.policy.String()+"/"+name, func(t *testing.T) {
				t.Parallel()
				h, b := setup(t, pool(t), pglimithttp.Config{OnError: tt.policy},
					pglimit.Config{Cooldown: 3 * time.Second, Timeout: 300 * time.Millisecond})
				start := time.Now()
				rec := get(t, h, "/items/alice")
				if elapsed := time.Since(start); elapsed > bound {
					t.Fatalf("answered after %s", elapsed)
				}
				if rec.Code != tt.code {
					t.Fatalf("status %d, want %d; body %s", rec.Code, tt.code, rec.Body)
				}
				ev := b.lastEvent(t)
				if ev.Outcome != tt.outcome || ev.Err == nil {
					t.Fatalf("event %+v", ev)
				}
				if name == "silent" && !errors.Is(ev.Err, pglimit.ErrTimeout) {
					t.Fatalf("silent server: %v, want ErrTimeout", ev.Err)
				}
				if tt.code == 200 {
					return
				}
				p := decodeProblem(t, rec, tt.code)
				if got := rec.Header().Get("Retry-After"); got != "3" {
					t.Fatalf("Retry-After %q, want the cooldown, 3", got)
				}
				if strings.Contains(p.Detail, "127.0.0.1") || strings.Contains(p.Detail, "SQLSTATE") {
					t.Fatalf("problem detail leaks the cause: %q", p.Detail)
				}
			})
		}
	}
}

// A client that disconnects cancels its request's context. That is the
// client giving up, not the limiter failing: whatever the error policy, the
// middleware reports OutcomeCanceled, never calls the handler, and answers
// 499, which nobody reads but access logs and metrics record.
func TestClientGoneIsNotAFailure(t *testing.T) {
	t.Parallel()
	for _, policy := range []pglimithttp.ErrorPolicy{pglimithttp.Unavailable, pglimithttp.FailOpen, pglimithttp.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			h, b := setup(t, nil, pglimithttp.Config{OnError: policy}, pglimit.Config{Cooldown: time.Minute})
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, "GET", "/items/alice", nil))
			ev := b.lastEvent(t)
			if ev.Outcome != pglimithttp.OutcomeCanceled || !errors.Is(ev.Err, context.Canceled) {
				t.Errorf("event %+v, want OutcomeCanceled with context.Canceled", ev)
			}
			if rec.Code != 499 || strings.Contains(rec.Body.String(), "items of") {
				t.Errorf("status %d, body %q; want 499 and no handler", rec.Code, rec.Body)
			}
		})
	}
}

func TestTerminatedBackend(t *testing.T) {
	t.Parallel()
	// The pool's only connection is killed by the server between two
	// requests, as a failover or an administrator would.
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["application_name"] = "pglimithttp-terminate-test"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema := testdb.Schema(t)
	h, b := setup(t, pool, pglimithttp.Config{}, pglimit.Config{Schema: schema, Cooldown: time.Minute})

	if rec := get(t, h, "/items/alice"); rec.Code != 200 {
		t.Fatalf("before: %d %s", rec.Code, rec.Body)
	}
	admin := testdb.Pool(t)
	var n int
	err = admin.QueryRow(context.Background(),
		`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`,
		"pglimithttp-terminate-test").Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("terminated %d backends, %v", n, err)
	}
	// pgxpool may notice the dead connection before using it (then the
	// request simply succeeds on a new one); either way it never hangs
	// and never answers anything but 429, 503 or 200.
	for range 3 {
		rec := get(t, h, "/items/bob")
		switch rec.Code {
		case 200, 429:
		case 503:
			if ev := b.lastEvent(t); ev.Err == nil {
				t.Fatalf("503 without an error: %+v", ev)
			}
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	}
	if rec := get(t, h, "/items/carol"); rec.Code != 200 {
		t.Fatalf("the pool did not recover: %d %s", rec.Code, rec.Body)
	}
}

// policyLimiter reports a policy of its own, as a Limiter of another make
// might.
type policyLimiter struct {
	pglimit.Limiter
	policy pglimit.Policy
}

func (p policyLimiter) Policy() pglimit.Policy { return p.policy }

func TestMiddlewareConfig(t *testing.T) {
	t.Parallel()
	lim, err := pglimit.New(deadPool(t), &pglimit.Config{Cooldown: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	withPolicy := func(limits ...pglimit.Limit) pglimit.Limiter {
		return policyLimiter{Limiter: lim, policy: pglimit.Policy{Limits: limits}}
	}
	for name, tt := range map[string]struct {
		lim pglimit.Limiter
		cfg *pglimithttp.Config
	}{
		"nil limiter":       {nil, &pglimithttp.Config{}},
		"unknown OnError":   {lim, &pglimithttp.Config{OnError: 42}},
		"negative interval": {lim, &pglimithttp.Config{LogInterval: -time.Second}},
		"no limits":         {withPolicy(), nil},
		"limit name \\r\\n": {withPolicy(pglimit.Limit{Name: "a\r\nX-Injected: 1", Rate: 1, Period: time.Second}), nil},
		"empty limit name":  {withPolicy(pglimit.Limit{Rate: 1, Period: time.Second}), nil},
	} {
		if mw, err := pglimithttp.Middleware(tt.lim, tt.cfg); !errors.Is(err, pglimithttp.ErrInvalidConfig) || mw != nil {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := pglimithttp.Middleware(lim, nil); err != nil {
		t.Errorf("nil Config: %v, want the defaults", err)
	}
	for _, s := range []string{"unavailable", "fail-open", "fail-closed"} {
		p, err := pglimithttp.ParseErrorPolicy(s)
		if err != nil || p.String() != s {
			t.Errorf("ParseErrorPolicy(%q) = %v, %v", s, p, err)
		}
	}
	if _, err := pglimithttp.ParseErrorPolicy("open"); err == nil {
		t.Error("ParseErrorPolicy(open) succeeded")
	}
}

// itemLimits are the demo's: 5 per minute with bursts of 3, and a daily
// quota.
func itemLimits(perDay int) []pglimit.Limit {
	return []pglimit.Limit{
		{Name: "per-minute", Rate: 5, Period: time.Minute, Burst: 3},
		{Name: "per-day", Rate: perDay, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
	}
}

// TestSeveralLimits: every limit is advertised, the binding one is
// reported, and a refusal names the limits that refused it.
func TestSeveralLimits(t *testing.T) {
	t.Parallel()
	const policy = `"per-minute";q=5;w=60, "per-day";q=20;w=86400`
	h, b := setup(t, nil, pglimithttp.Config{}, pglimit.Config{Limits: itemLimits(20)})
	// Each admission uses one unit of the burst of 3; the key is back to
	// full 12 s (one emission interval) per unit used, less the time
	// passed, rounded up.
	for i, remaining := range []int{2, 1, 0} {
		rec := get(t, h, "/items/alice")
		if rec.Code != 200 {
			t.Fatalf("request %d: %d %s", i, rec.Code, rec.Body)
		}
		if got := rec.Header().Get("RateLimit-Policy"); got != policy {
			t.Fatalf("request %d: RateLimit-Policy %s, want %s", i, got, policy)
		}
		d := b.lastEvent(t).Decision
		want := fmt.Sprintf(`"per-minute";r=%d;t=%d`, remaining, ceilSeconds(d.ResetAfter))
		if got := rec.Header().Get("RateLimit"); got != want {
			t.Fatalf("request %d: RateLimit %s, want %s", i, got, want)
		}
		if reset := time.Duration(i+1) * 12 * time.Second; d.ResetAfter > reset || d.ResetAfter <= reset-5*time.Second {
			t.Fatalf("request %d: ResetAfter %s, want a little under %s", i, d.ResetAfter, reset)
		}
	}
	rec := get(t, h, "/items/alice")
	p := decodeProblem(t, rec, 429)
	d := b.lastEvent(t).Decision
	if d.RetryAfter <= 0 || d.RetryAfter > 12*time.Second {
		t.Fatalf("RetryAfter %s, want at most one emission interval, 12 s", d.RetryAfter)
	}
	if got, want := rec.Header().Get("Retry-After"), strconv.Itoa(ceilSeconds(d.RetryAfter)); got != want {
		t.Fatalf("Retry-After %q, want %s (RetryAfter %s rounded up)", got, want, d.RetryAfter)
	}
	if got, want := rec.Header().Get("RateLimit"), fmt.Sprintf(`"per-minute";r=0;t=%d`, ceilSeconds(d.ResetAfter)); got != want {
		t.Fatalf("refusal RateLimit %s, want %s", got, want)
	}
	if len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "per-minute" {
		t.Fatalf("violated-policies %q, want [per-minute]", p.ViolatedPolicies)
	}
}

// TestBothLimitsViolated: when every limit refuses, Retry-After is the
// longest wait among them and the body lists them all, in the limiter's
// order.
func TestBothLimitsViolated(t *testing.T) {
	t.Parallel()
	h, b := setup(t, nil, pglimithttp.Config{}, pglimit.Config{Limits: itemLimits(3)})
	for range 3 {
		if rec := get(t, h, "/items/alice"); rec.Code != 200 {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	}
	rec := get(t, h, "/items/alice")
	p := decodeProblem(t, rec, 429)
	d := b.lastEvent(t).Decision
	if d.Limit.Name != "per-day" || d.RetryAfter < 23*time.Hour {
		t.Fatalf("binding %s, RetryAfter %s; want per-day, about a day", d.Limit.Name, d.RetryAfter)
	}
	secs := ceilSeconds(d.RetryAfter)
	if got := rec.Header().Get("Retry-After"); got != strconv.Itoa(secs) {
		t.Fatalf("Retry-After %q, want %d (the per-day wait, the longer)", got, secs)
	}
	if got, want := rec.Header().Get("RateLimit"), fmt.Sprintf(`"per-day";r=0;t=%d`, secs); got != want {
		t.Fatalf("RateLimit %s, want %s", got, want)
	}
	if strings.Join(p.ViolatedPolicies, ",") != "per-minute,per-day" {
		t.Fatalf("violated-policies %q, want [per-minute per-day]", p.ViolatedPolicies)
	}
}

// costHeader reads a request's cost from X-Cost.
func costHeader(r *http.Request) (int, error) {
	return strconv.Atoi(r.Header.Get("X-Cost"))
}

func TestCost(t *testing.T) {
	t.Parallel()
	h, b := setup(t, nil, pglimithttp.Config{CostFunc: costHeader}, pglimit.Config{Limits: itemLimits(20)})
	send := func(cost string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/items/alice", nil)
		r.Header.Set("X-Cost", cost)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	// Not a number, not positive, more than the burst of 3: 400, and
	// nothing consumed.
	for _, cost := range []string{"", "two", "0", "-1", "4"} {
		rec := send(cost)
		decodeProblem(t, rec, 400)
		ev := b.lastEvent(t)
		if ev.Outcome != pglimithttp.OutcomeBadCost || !errors.Is(ev.Err, pglimit.ErrInvalidCost) {
			t.Errorf("cost %q: event %+v, want OutcomeBadCost with ErrInvalidCost", cost, ev)
		}
		if rec.Header().Get("RateLimit") != "" {
			t.Errorf("cost %q: RateLimit on a bad request: %s", cost, rec.Header().Get("RateLimit"))
		}
	}
	rec := send("2")
	ev := b.lastEvent(t)
	if want := fmt.Sprintf(`"per-minute";r=1;t=%d`, ceilSeconds(ev.Decision.ResetAfter)); rec.Code != 200 || rec.Header().Get("RateLimit") != want {
		t.Fatalf("cost 2 after the bad ones: %d RateLimit %s; want 200 and %s, 1 of the burst of 3 left", rec.Code, rec.Header().Get("RateLimit"), want)
	}
	if ev.Cost != 2 || ev.Decision.Granted != 2 {
		t.Fatalf("event %+v, want cost 2 granted", ev)
	}
	rec = send("2")
	decodeProblem(t, rec, 429)
	if got := rec.Header().Get("RateLimit"); !strings.HasPrefix(got, `"per-minute";r=1;t=`) {
		t.Fatalf("refused cost 2: RateLimit %s, want the 1 unit left", got)
	}
	if rec := send("1"); rec.Code != 200 {
		t.Fatalf("cost 1 with 1 left: %d", rec.Code)
	}
}

// TestFailClosedLongestWait: with the database down, a fail-closed refusal
// tells the client to wait as long as the longest limit can make it.
func TestFailClosedLongestWait(t *testing.T) {
	t.Parallel()
	h, _ := setup(t, deadPool(t), pglimithttp.Config{OnError: pglimithttp.FailClosed},
		pglimit.Config{Limits: itemLimits(20), Timeout: 300 * time.Millisecond})
	rec := get(t, h, "/items/alice")
	p := decodeProblem(t, rec, 429)
	if got := rec.Header().Get("Retry-After"); got != "86400" {
		t.Fatalf("Retry-After %q, want a day, the per-day window", got)
	}
	if got := rec.Header().Get("RateLimit"); got != `"per-day";r=0;t=86400` {
		t.Fatalf("RateLimit %s", got)
	}
	if len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "per-day" {
		t.Fatalf("violated-policies %q", p.ViolatedPolicies)
	}
}

// TestRealServer goes through net/http end to end, where header
// canonicalisation and Content-Length are those a client sees.
func TestRealServer(t *testing.T) {
	t.Parallel()
	h, _ := setup(t, nil, pglimithttp.Config{}, pglimit.Config{
		Limits: []pglimit.Limit{{Name: "per-user", Rate: 1, Period: 2 * time.Second}},
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	client := srv.Client()
	var resp *http.Response
	for range 2 {
		r, err := client.Get(srv.URL + "/items/alice")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		resp = r
	}
	if resp.StatusCode != 429 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := resp.Header.Get("Ratelimit-Policy"); got != `"per-user";q=1;w=2` {
		t.Fatalf("RateLimit-Policy %q", got)
	}
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 2 {
		t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
}

// With several limits, a database outage's 503 sends clients back after the
// shortest interval between two units (12s for 5 per minute), not after the
// longest wait (a day-long quota), which only a fail-closed 429 claims.
func TestDatabaseDownSeveralLimits(t *testing.T) {
	t.Parallel()
	limits := []pglimit.Limit{
		{Name: "per-minute", Rate: 5, Period: time.Minute, Burst: 3},
		{Name: "per-day", Rate: 20, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
	}
	for _, tt := range []struct {
		policy pglimithttp.ErrorPolicy
		code   int
		retry  string
	}{
		{pglimithttp.Unavailable, 503, "12"},
		{pglimithttp.FailClosed, 429, "86400"},
	} {
		t.Run(tt.policy.String(), func(t *testing.T) {
			t.Parallel()
			h, _ := setup(t, deadPool(t), pglimithttp.Config{OnError: tt.policy},
				pglimit.Config{Limits: limits, Timeout: 300 * time.Millisecond})
			rec := get(t, h, "/items/alice")
			if rec.Code != tt.code {
				t.Fatalf("status %d, want %d; body %s", rec.Code, tt.code, rec.Body)
			}
			if got := rec.Header().Get("Retry-After"); got != tt.retry {
				t.Fatalf("Retry-After %q, want %s", got, tt.retry)
			}
		})
	}
}

// Exempt requests reach the handler without a key, a decision or a
// database call; the others are limited as before.
func TestExempt(t *testing.T) {
	t.Parallel()
	var sawDecision atomic.Bool
	h, b := setup(t, nil, pglimithttp.Config{
		Exempt: func(r *http.Request) bool { return r.Header.Get("X-Internal") == "yes" },
	}, pglimit.Config{Cooldown: time.Minute})
	probe := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := pglimithttp.DecisionFrom(r.Context())
		sawDecision.Store(ok)
		h.ServeHTTP(w, r)
	})
	for range 3 {
		r := httptest.NewRequest("GET", "/items/alice", nil)
		r.Header.Set("X-Internal", "yes")
		rec := httptest.NewRecorder()
		probe.ServeHTTP(rec, r)
		if rec.Code != 200 || rec.Header().Get("RateLimit") != "" {
			t.Fatalf("exempt request: %d RateLimit %q, want 200 and no header", rec.Code, rec.Header().Get("RateLimit"))
		}
		if ev := b.lastEvent(t); ev.Outcome != pglimithttp.OutcomeExempt {
			t.Fatalf("event %+v, want OutcomeExempt", ev)
		}
	}
	if n := b.lim.calls.Load(); n != 0 {
		t.Fatalf("%d exempt requests reached the limiter", n)
	}
	if codes := [2]int{get(t, h, "/items/alice").Code, get(t, h, "/items/alice").Code}; codes != [2]int{200, 429} {
		t.Fatalf("requests that are not exempt: %v, want [200 429]", codes)
	}
}

func TestExemptKeys(t *testing.T) {
	t.Parallel()
	h, b := setup(t, nil, pglimithttp.Config{ExemptKeys: []string{"monitor"}}, pglimit.Config{Cooldown: time.Minute})
	for range 3 {
		if rec := get(t, h, "/items/monitor"); rec.Code != 200 {
			t.Fatalf("exempt key: %d", rec.Code)
		}
		if ev := b.lastEvent(t); ev.Outcome != pglimithttp.OutcomeExempt || ev.Key != "monitor" {
			t.Fatalf("event %+v", ev)
		}
	}
	if n := b.lim.calls.Load(); n != 0 {
		t.Fatalf("%d requests of an exempt key reached the limiter", n)
	}
	if codes := [2]int{get(t, h, "/items/alice").Code, get(t, h, "/items/alice").Code}; codes != [2]int{200, 429} {
		t.Fatalf("another key: %v, want [200 429]", codes)
	}
	lim, err := pglimit.New(deadPool(t), &pglimit.Config{Cooldown: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "\xff", strings.Repeat("k", pglimit.MaxKeyLength+1)} {
		_, err := pglimithttp.Middleware(lim, &pglimithttp.Config{ExemptKeys: []string{"ok", bad}})
		if !errors.Is(err, pglimithttp.ErrInvalidConfig) || !strings.Contains(err.Error(), "ExemptKeys[1]") {
			t.Errorf("ExemptKeys %q: %v, want ErrInvalidConfig naming ExemptKeys[1]", bad, err)
		}
	}
}

// The handler finds the decision in the request's context; a fail-open
// request has none.
func TestDecisionFrom(t *testing.T) {
	t.Parallel()
	serve := func(t *testing.T, pool *pgxpool.Pool, onError pglimithttp.ErrorPolicy) (int, seen) {
		var s seen
		h, _ := setup(t, pool, pglimithttp.Config{OnError: onError}, pglimit.Config{Limits: itemLimits(20), Timeout: 300 * time.Millisecond})
		rec := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/items/alice", nil)
		h.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), probeKey{}, &s)))
		return rec.Code, s
	}
	code, s := serve(t, nil, pglimithttp.Unavailable)
	if code != 200 || !s.ok || !s.d.Allowed || s.d.Remaining != 2 || s.d.Limit.Name != "per-minute" {
		t.Fatalf("admitted: %d, decision %+v ok=%v; want 200, allowed, 2 remaining under per-minute", code, s.d, s.ok)
	}
	code, s = serve(t, deadPool(t), pglimithttp.FailOpen)
	if code != 200 || s.ok {
		t.Fatalf("fail-open: %d ok=%v, want 200 and no decision", code, s.ok)
	}
	if _, ok := pglimithttp.DecisionFrom(context.Background()); ok {
		t.Fatal("a context the middleware never saw has a decision")
	}
}

// probeKey carries a place where the test handler of setup stores what
// DecisionFrom returned.
type probeKey struct{}

// seen is what the test handler found with DecisionFrom.
type seen = struct {
	d  pglimit.Decision
	ok bool
}

// OnRefused writes refusals, with the headers already set and the
// decision in the context; a fail-closed refusal reaches it too, without
// a decision.
func TestOnRefused(t *testing.T) {
	t.Parallel()
	onRefused := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusTooManyRequests)
		if d, ok := pglimithttp.DecisionFrom(r.Context()); ok {
			fmt.Fprintf(w, "slow down: %s allows no more; retry after %s s\n", d.Limit.Name, w.Header().Get("Retry-After"))
			return
		}
		fmt.Fprintf(w, "slow down; retry after %s s\n", w.Header().Get("Retry-After"))
	})
	h, _ := setup(t, nil, pglimithttp.Config{OnRefused: onRefused}, pglimit.Config{Cooldown: time.Minute})
	if rec := get(t, h, "/items/alice"); rec.Code != 200 {
		t.Fatalf("first: %d", rec.Code)
	}
	rec := get(t, h, "/items/alice")
	ra := rec.Header().Get("Retry-After")
	if rec.Code != 429 || ra == "" || rec.Header().Get("RateLimit") == "" {
		t.Fatalf("refusal: %d Retry-After %q RateLimit %q", rec.Code, ra, rec.Header().Get("RateLimit"))
	}
	if want := "slow down: cooldown allows no more; retry after " + ra + " s\n"; rec.Body.String() != want {
		t.Fatalf("body %q, want %q", rec.Body, want)
	}

	fc, _ := setup(t, deadPool(t), pglimithttp.Config{OnRefused: onRefused, OnError: pglimithttp.FailClosed},
		pglimit.Config{Cooldown: time.Minute, Timeout: 300 * time.Millisecond})
	rec = get(t, fc, "/items/alice")
	if rec.Code != 429 || rec.Body.String() != "slow down; retry after 60 s\n" {
		t.Fatalf("fail-closed: %d %q", rec.Code, rec.Body)
	}
}

// Failures are logged without configuration, to slog.Default, one line
// per interval. Not parallel: it replaces the default logger, and
// parallel tests start only after the sequential ones are done.
func TestFailuresLoggedByDefault(t *testing.T) {
	var buf syncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })

	h, _ := setup(t, deadPool(t), pglimithttp.Config{}, pglimit.Config{Cooldown: time.Minute, Timeout: 300 * time.Millisecond})
	for range 5 { // well within the default 10s, even on a slow machine
		if rec := get(t, h, "/items/alice"); rec.Code != 503 {
			t.Fatalf("status %d", rec.Code)
		}
	}
	out := buf.String()
	if n := strings.Count(out, "\n"); n != 1 || !strings.Contains(out, "level=WARN") ||
		!strings.Contains(out, "pglimithttp: limiter failed") || !strings.Contains(out, "key=alice") || !strings.Contains(out, "suppressed=0") {
		t.Fatalf("%d lines for 5 failures, want 1 warning naming the key:\n%s", n, out)
	}

	// A logger of one's own, and an interval that lets every failure
	// through after the first line's.
	var own syncBuffer
	h, _ = setup(t, deadPool(t), pglimithttp.Config{Logger: slog.New(slog.NewTextHandler(&own, nil)), LogInterval: time.Hour},
		pglimit.Config{Cooldown: time.Minute, Timeout: 300 * time.Millisecond})
	get(t, h, "/items/bob")
	get(t, h, "/items/bob")
	if n := strings.Count(own.String(), "\n"); n != 1 || buf.String() != out {
		t.Fatalf("own logger: %d lines, default logger grew: %v", n, buf.String() != out)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A real server behind a trusted proxy that writes Forwarded: the key is
// the client the proxy names, by its /64, whatever the client claims.
func TestForwardedThroughServer(t *testing.T) {
	t.Parallel()
	kf, err := pglimithttp.RemoteIP(&pglimithttp.RemoteIPConfig{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Header:         "Forwarded",
	})
	if err != nil {
		t.Fatal(err)
	}
	h, b := setup(t, nil, pglimithttp.Config{KeyFunc: kf}, pglimit.Config{Cooldown: time.Minute})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	send := func(forwarded string) int {
		req, err := http.NewRequest("GET", srv.URL+"/items/x", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Forwarded", forwarded)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := send(`for="[2001:db8:1:2::a]:5000"`); code != 200 {
		t.Fatalf("first: %d", code)
	}
	if ev := b.lastEvent(t); ev.Key != "2001:db8:1:2::/64" {
		t.Fatalf("key %q, want the client's /64", ev.Key)
	}
	// Another address of the same /64, claiming to be someone else on the
	// left: refused.
	if code := send(`for=198.51.100.1, for="[2001:db8:1:2::b]"`); code != 429 {
		t.Fatalf("same /64: %d, want 429", code)
	}
	if code := send(`for="[2001:db8:1:3::a]"`); code != 200 {
		t.Fatalf("next /64: %d, want 200", code)
	}
	if code := send(`for="[2001:db8::1`); code != 400 {
		t.Fatalf("malformed Forwarded: %d, want 400", code)
	}
}
