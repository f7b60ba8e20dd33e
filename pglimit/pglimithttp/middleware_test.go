package pglimithttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

func TestMain(m *testing.M) { pglimittest.Main(m) }

// countingLimiter counts the calls that reach the real limiter.
type countingLimiter struct {
	pglimit.Limiter
	calls atomic.Int64
}

func (c *countingLimiter) Allow(ctx context.Context, key string) (pglimit.Decision, error) {
	c.calls.Add(1)
	return c.Limiter.Allow(ctx, key)
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
		db = pglimittest.Pool(t)
		limCfg.Schema = pglimittest.Schema(t)
	}
	lim, err := pglimit.New(db, &limCfg)
	if err != nil {
		t.Fatal(err)
	}
	b := &testBundle{lim: &countingLimiter{Limiter: lim}}
	cfg.Cooldown = limCfg.Cooldown
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
	h, _ := setup(t, nil, pglimithttp.Config{KeyFunc: pglimithttp.RemoteIP(nil)}, pglimit.Config{Cooldown: time.Minute})
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
	cfg, err := pgxpool.ParseConfig(pglimittest.URL(t))
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
	schema := pglimittest.Schema(t)
	h, b := setup(t, pool, pglimithttp.Config{}, pglimit.Config{Schema: schema, Cooldown: time.Minute})

	if rec := get(t, h, "/items/alice"); rec.Code != 200 {
		t.Fatalf("before: %d %s", rec.Code, rec.Body)
	}
	admin := pglimittest.Pool(t)
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

func TestMiddlewareConfig(t *testing.T) {
	t.Parallel()
	lim, err := pglimit.New(deadPool(t), &pglimit.Config{Cooldown: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for name, tt := range map[string]struct {
		lim pglimit.Limiter
		cfg *pglimithttp.Config
	}{
		"nil limiter":     {nil, &pglimithttp.Config{Cooldown: time.Second}},
		"nil config":      {lim, nil},
		"zero cooldown":   {lim, &pglimithttp.Config{}},
		"policy newline":  {lim, &pglimithttp.Config{Cooldown: time.Second, Policy: "a\nb"}},
		"unknown OnError": {lim, &pglimithttp.Config{Cooldown: time.Second, OnError: 42}},
	} {
		if mw, err := pglimithttp.Middleware(tt.lim, tt.cfg); !errors.Is(err, pglimithttp.ErrInvalidConfig) || mw != nil {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
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

// TestRealServer goes through net/http end to end, where header
// canonicalisation and Content-Length are those a client sees.
func TestRealServer(t *testing.T) {
	t.Parallel()
	h, _ := setup(t, nil, pglimithttp.Config{Policy: "per-user"}, pglimit.Config{Cooldown: 2 * time.Second})
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
