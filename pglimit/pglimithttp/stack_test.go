package pglimithttp_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
)

// stackResponse is what a client of a stack of middlewares reads.
type stackResponse struct {
	status              int
	policy, rateLimit   string
	retryAfter          string
	violated            []string
	applicationAnswered bool
}

// stackGet sends a request of the given query as user bob of org acme
// to srv, over loopback.
func stackGet(t *testing.T, srv *httptest.Server, query string) stackResponse {
	t.Helper()
	req, err := http.NewRequest("GET", srv.URL+"/?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Org", "acme")
	req.Header.Set("X-User", "bob")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := stackResponse{
		status: resp.StatusCode, policy: resp.Header.Get("RateLimit-Policy"),
		rateLimit: resp.Header.Get("RateLimit"), retryAfter: resp.Header.Get("Retry-After"),
		applicationAnswered: string(body) == "busy\n",
	}
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		var p problemBody
		if err := json.Unmarshal(body, &p); err != nil {
			t.Fatalf("problem body %q: %v", body, err)
		}
		out.violated = p.ViolatedPolicies
	}
	return out
}

// remaining is how many units key has left of the first limit of cfg's
// limiter, as the database holds them.
func remaining(t *testing.T, cfg *pglimit.Config, key string) int {
	t.Helper()
	st, err := pglimit.Inspect(context.Background(), testdb.Limiter(t, testdb.Pool(t), cfg), key)
	if err != nil {
		t.Fatal(err)
	}
	return st.Limits[0].Remaining
}

// The composition of issue 45, item 15: counts per org and per user
// through Levels, around a size budget settled at the handler's real
// cost through Middleware, over a real server on loopback. A request the
// inner middleware answers itself (429 past the size budget, 400 for a
// cost it cannot compute) leaves the outer counts as they were, and the
// headers carry every middleware's policies, with the refusing limit's
// RateLimit item. An application's own 429 is not a refusal: it counts.
func TestStackRefusedInsideChargesNothingOutside(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	orgCfg := pglimit.Config{Schema: schema, Namespace: "org", Limits: []pglimit.Limit{{Name: "org-day", Rate: 1000, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow}}}
	day := pglimit.PerDay(100)
	day.Name = "per-day"
	userCfg := pglimit.Config{Schema: schema, Namespace: "user", Limits: []pglimit.Limit{day}}
	sizeCfg := pglimit.Config{Schema: schema, Namespace: "size", Limits: []pglimit.Limit{{Name: "bytes", Rate: 1000, Period: time.Hour, Algorithm: pglimit.FixedWindow}}}
	var lims []pglimit.Limiter
	for _, cfg := range []*pglimit.Config{&orgCfg, &userCfg, &sizeCfg} {
		lim, err := pglimit.New(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		lims = append(lims, lim)
	}
	outer, err := pglimithttp.Levels([]pglimithttp.Level{
		{Limiter: lims[0], KeyFunc: pglimithttp.FromHeader("X-Org")},
		{Limiter: lims[1], KeyFunc: pglimithttp.FromHeader("X-User")},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := pglimithttp.Middleware(lims[2], &pglimithttp.Config{
		KeyFunc:  pglimithttp.FromHeader("X-User"),
		CostFunc: func(r *http.Request) (int, error) { return strconv.Atoi(r.URL.Query().Get("size")) },
		Settle:   true,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(outer(inner(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("busy") {
			// The application's own 429, no limiter's.
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, "busy\n") //nolint:errcheck // the test reads the status
			return
		}
		size, _ := strconv.Atoi(r.URL.Query().Get("size"))
		pglimithttp.SetCost(r.Context(), size/2) // compressed: half the estimate
	}))))
	t.Cleanup(srv.Close)
	counts := func(when string, org, user, bytes int) {
		t.Helper()
		if got := [3]int{remaining(t, &orgCfg, "acme"), remaining(t, &userCfg, "bob"), remaining(t, &sizeCfg, "bob")}; got != [3]int{org, user, bytes} {
			t.Errorf("%s: org, per-day and bytes have %v left, want %v", when, got, [3]int{org, user, bytes})
		}
	}

	// Admitted by both: 800 bytes estimated, 400 settled.
	resp := stackGet(t, srv, "size=800")
	if resp.status != http.StatusOK {
		t.Fatalf("the first request: %+v", resp)
	}
	for _, p := range []string{`"org-day";q=1000;w=86400`, `"per-day";q=100;w=86400`, `"bytes";q=1000;w=3600`} {
		if !strings.Contains(resp.policy, p) {
			t.Errorf("admitted: RateLimit-Policy %q lacks %s", resp.policy, p)
		}
	}
	if !strings.Contains(resp.rateLimit, `"per-day";r=99;`) || !strings.Contains(resp.rateLimit, `"bytes";r=200;`) {
		t.Errorf("admitted: RateLimit %q, want the per-day item (99 left) and the bytes one (200 left before the settle)", resp.rateLimit)
	}
	counts("admitted", 999, 99, 600)

	// Refused by the size budget: 700 bytes, 600 left.
	resp = stackGet(t, srv, "size=700")
	if resp.status != http.StatusTooManyRequests || !slices.Equal(resp.violated, []string{"bytes"}) || resp.retryAfter == "" {
		t.Fatalf("past the size budget: %+v, want 429 violating bytes", resp)
	}
	counts("after a 429 of the size budget", 999, 99, 600)
	for _, p := range []string{`"org-day"`, `"per-day"`, `"bytes"`} {
		if !strings.Contains(resp.policy, p) {
			t.Errorf("refused: RateLimit-Policy %q lacks %s", resp.policy, p)
		}
	}
	if !strings.HasPrefix(resp.rateLimit, `"bytes";r=600;t=`) || strings.Contains(resp.rateLimit, "per-day") {
		t.Errorf("refused: RateLimit %q, want the bytes limit alone (the outer counts are given back)", resp.rateLimit)
	}

	// A cost the inner middleware cannot compute: 400, charged nowhere.
	if resp = stackGet(t, srv, "size=many"); resp.status != http.StatusBadRequest {
		t.Fatalf("a bad size: %+v, want 400", resp)
	}
	counts("after a 400 of the size budget", 999, 99, 600)

	// The application's 429 counts: no middleware refused the request.
	if resp = stackGet(t, srv, "size=10&busy"); resp.status != http.StatusTooManyRequests || !resp.applicationAnswered {
		t.Fatalf("the application's 429: %+v", resp)
	}
	counts("after the application's 429", 998, 98, 590)
}

// The other way round: a settled size budget outside, a concurrency limit
// inside. A request the semaphore refuses gets its whole estimate back,
// not kept as a settle without a cost would keep it, and its 429 carries
// both policies with the concurrency item; an admitted request carries
// both policies and is settled as before.
func TestStackSettledOutsideGivesBackItsEstimate(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	sizeCfg := pglimit.Config{Schema: schema, Namespace: "size", Limits: []pglimit.Limit{{Name: "bytes", Rate: 1000, Period: time.Hour, Algorithm: pglimit.FixedWindow}}}
	size, err := pglimit.New(pool, &sizeCfg)
	if err != nil {
		t.Fatal(err)
	}
	outer, err := pglimithttp.Middleware(size, &pglimithttp.Config{
		KeyFunc:  pglimithttp.FromHeader("X-User"),
		CostFunc: func(r *http.Request) (int, error) { return strconv.Atoi(r.URL.Query().Get("size")) },
		Settle:   true,
	})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := pglimithttp.Concurrency(newSemaphore(t, 1, time.Minute), &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User")})
	if err != nil {
		t.Fatal(err)
	}
	inside, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(outer(inner(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("hold") {
			inside <- struct{}{}
			<-release
		}
		pglimithttp.SetCost(r.Context(), 50)
	}))))
	t.Cleanup(srv.Close)

	held := make(chan stackResponse, 1)
	go func() { held <- stackGet(t, srv, "size=100&hold") }()
	<-inside
	resp := stackGet(t, srv, "size=300")
	if resp.status != http.StatusTooManyRequests || !slices.Equal(resp.violated, []string{"concurrency"}) {
		t.Fatalf("a second request while the slot is held: %+v, want 429 violating concurrency", resp)
	}
	if !strings.Contains(resp.policy, `"bytes";q=1000`) || !strings.Contains(resp.policy, `"concurrency";q=1`) ||
		!strings.HasPrefix(resp.rateLimit, `"concurrency";r=0;t=`) || strings.Contains(resp.rateLimit, "bytes") {
		t.Errorf("refused by the semaphore: RateLimit-Policy %q, RateLimit %q; want both policies and the concurrency item alone", resp.policy, resp.rateLimit)
	}
	if got := remaining(t, &sizeCfg, "bob"); got != 900 {
		t.Errorf("after the semaphore's 429: %d bytes left, want 900 (the held request's 100 only)", got)
	}
	close(release)
	resp = <-held
	if resp.status != http.StatusOK || !strings.Contains(resp.policy, `"bytes"`) || !strings.Contains(resp.policy, `"concurrency"`) || !strings.HasPrefix(resp.rateLimit, `"bytes";r=900;`) {
		t.Errorf("the held request: %+v, want 200 with both policies and the bytes item", resp)
	}
	if got := remaining(t, &sizeCfg, "bob"); got != 950 {
		t.Errorf("after the held request settled at 50: %d bytes left, want 950", got)
	}
}

// A refund the outer limiter cannot make (Range has no Refund) keeps its
// units charged and is logged: the next request meets the outer cooldown.
func TestStackRefundFailureLogged(t *testing.T) {
	t.Parallel()
	cooldown, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: testdb.Schema(t), Strategy: pglimit.Range, Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var log syncBuffer
	outer, err := pglimithttp.Middleware(cooldown, &pglimithttp.Config{
		KeyFunc: pglimithttp.FromHeader("X-User"),
		Logger:  slog.New(slog.NewTextHandler(&log, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	// The inner middleware answers 400: the request has no X-Key.
	inner, err := pglimithttp.Middleware(cooldown, &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-Key")})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(outer(inner(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))))
	t.Cleanup(srv.Close)
	if resp := stackGet(t, srv, ""); resp.status != http.StatusBadRequest {
		t.Fatalf("no X-Key: %+v, want 400", resp)
	}
	if !strings.Contains(log.String(), "refund of 1 units of a request refused inside") || !strings.Contains(log.String(), "range strategy") {
		t.Errorf("the log after a refund Range cannot make: %q", log.String())
	}
	if resp := stackGet(t, srv, ""); resp.status != http.StatusTooManyRequests || !slices.Equal(resp.violated, []string{"cooldown"}) {
		t.Errorf("the next request: %+v, want 429 by the outer cooldown, whose unit stayed charged", resp)
	}
}

// Two settling middlewares, one inside the other: SetCost reaches the
// inner one, which settles at it; the outer one keeps its estimate.
func TestStackSetCostReachesTheInnermost(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	var cfgs []pglimit.Config
	var mws []func(http.Handler) http.Handler
	for _, name := range []string{"outer", "inner"} {
		cfg := pglimit.Config{Schema: schema, Namespace: name, Limits: []pglimit.Limit{{Name: name, Rate: 100, Period: time.Hour, Algorithm: pglimit.FixedWindow}}}
		lim, err := pglimit.New(pool, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		mw, err := pglimithttp.Middleware(lim, &pglimithttp.Config{
			KeyFunc:  pglimithttp.FromHeader("X-User"),
			CostFunc: func(*http.Request) (int, error) { return 10, nil },
			Settle:   true,
		})
		if err != nil {
			t.Fatal(err)
		}
		cfgs, mws = append(cfgs, cfg), append(mws, mw)
	}
	srv := httptest.NewServer(mws[0](mws[1](http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pglimithttp.SetCost(r.Context(), 3)
	}))))
	t.Cleanup(srv.Close)
	if resp := stackGet(t, srv, ""); resp.status != http.StatusOK {
		t.Fatalf("%+v", resp)
	}
	if outer, inner := remaining(t, &cfgs[0], "bob"), remaining(t, &cfgs[1], "bob"); outer != 90 || inner != 97 {
		t.Errorf("outer %d and inner %d left, want 90 (the estimate) and 97 (settled at 3)", outer, inner)
	}
}

// An inner limiter whose database is down answers 503: the outer count
// is given back, and the 503 keeps the outer policy without its stale
// RateLimit item.
func TestStackOutageInsideChargesNothingOutside(t *testing.T) {
	t.Parallel()
	countCfg := pglimit.Config{Schema: testdb.Schema(t), Limits: []pglimit.Limit{{Name: "per-hour", Rate: 10, Period: time.Hour, Algorithm: pglimit.FixedWindow}}}
	count, err := pglimit.New(testdb.Pool(t), &countCfg)
	if err != nil {
		t.Fatal(err)
	}
	down, err := pglimit.New(deadPool(t), &pglimit.Config{Cooldown: time.Minute, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	outer, err := pglimithttp.Middleware(count, &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User")})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := pglimithttp.Middleware(down, &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(outer(inner(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))))
	t.Cleanup(srv.Close)
	resp := stackGet(t, srv, "")
	if resp.status != http.StatusServiceUnavailable || resp.policy != `"per-hour";q=10;w=3600` || resp.rateLimit != "" {
		t.Errorf("the inner limiter down: %+v, want 503 with the outer policy and no RateLimit", resp)
	}
	if got := remaining(t, &countCfg, "bob"); got != 10 {
		t.Errorf("after the inner 503: %d left of the outer count, want 10", got)
	}
}
