package pglimithttp_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// With IdempotencyKey, a retried request (same Idempotency-Key, quoted
// or bare) is charged once and answered with the first decision's
// headers; a key that is not a valid id is a 400 that charges nothing;
// a request without one is charged as usual.
func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: testdb.Schema(t), Limits: []pglimit.Limit{{Name: "api", Rate: 3, Period: time.Hour, Burst: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimithttp.Middleware(lim, &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User"), IdempotencyKey: true})
	if err != nil {
		t.Fatal(err)
	}
	var replayed []bool
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := pglimithttp.DecisionFrom(r.Context())
		replayed = append(replayed, d.Replayed)
	}))
	do := func(keys ...string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest("POST", "/", nil)
		req.Header.Set("X-User", "bob")
		for _, k := range keys {
			req.Header.Add("Idempotency-Key", k)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	first := do(`"8e03978e-40d5"`)
	if first.Code != http.StatusOK {
		t.Fatalf("first request: %d", first.Code)
	}
	for _, k := range []string{`"8e03978e-40d5"`, `8e03978e-40d5`} {
		retry := do(k)
		if retry.Code != http.StatusOK || retry.Header().Get("RateLimit") != first.Header().Get("RateLimit") {
			t.Errorf("retry with %s: %d %q, want 200 and the first decision's %q", k, retry.Code, retry.Header().Get("RateLimit"), first.Header().Get("RateLimit"))
		}
	}
	for _, bad := range [][]string{{`""`}, {`"unterminated`}, {`"a\b"`}, {strings.Repeat("x", pglimit.MaxIDLength+1)}, {"a", "b"}} {
		if rec := do(bad...); rec.Code != http.StatusBadRequest {
			t.Errorf("Idempotency-Key %q: %d, want 400", bad, rec.Code)
		}
	}
	if d, err := lim.Peek(t.Context(), "bob", 1); err != nil || d.Remaining != 1 {
		t.Fatalf("after one charged request bob has %d left after one more (%v), want 1", d.Remaining, err)
	}
	if rec := do(); rec.Code != http.StatusOK {
		t.Fatalf("a request without a key: %d", rec.Code)
	}
	if d, _ := lim.Peek(t.Context(), "bob", 1); d.Remaining != 0 {
		t.Errorf("a request without a key was not charged: %d left after one more", d.Remaining)
	}
	if want := []bool{false, true, true, false}; len(replayed) != len(want) || replayed[0] || !replayed[1] || !replayed[2] || replayed[3] {
		t.Errorf("handlers saw Replayed %v, want %v", replayed, want)
	}
}

// IdempotencyKey applies where decisions take ids: not with
// Concurrency, whose slots take none.
func TestIdempotencyKeyConfig(t *testing.T) {
	t.Parallel()
	sem, err := pglimitsem.New(testdb.Pool(t), &pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pglimithttp.Concurrency(sem, &pglimithttp.Config{IdempotencyKey: true}); !errors.Is(err, pglimithttp.ErrInvalidConfig) {
		t.Errorf("Concurrency: %v", err)
	}
}

// With Levels, a retried request is charged once at every level, and one
// a handler inside answers is given back at every level by its id.
func TestIdempotencyKeyLevels(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	newLim := func(ns string) pglimit.Limiter {
		lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: ns, Limits: []pglimit.Limit{{Name: ns, Rate: 3, Period: time.Hour, Burst: 3}}})
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}
	org, user := newLim("org"), newLim("user")
	mw, err := pglimithttp.Levels([]pglimithttp.Level{
		{Limiter: org, KeyFunc: pglimithttp.FromHeader("X-Org")},
		{Limiter: user, KeyFunc: pglimithttp.FromHeader("X-User")},
	}, &pglimithttp.Config{IdempotencyKey: true})
	if err != nil {
		t.Fatal(err)
	}
	// Stacked inside: a middleware that refuses every request of "carol".
	inner, err := pglimithttp.Middleware(newLim("inner"), &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User"), CostFunc: func(r *http.Request) (int, error) {
		if r.Header.Get("X-User") == "carol" {
			return 3, nil
		}
		return 1, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	var replayed []bool
	h := mw(inner(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ds, _ := pglimithttp.DecisionsFrom(r.Context())
		replayed = append(replayed, ds.Levels[0].Replayed && ds.Levels[1].Replayed)
	})))
	do := func(user, key string) int {
		t.Helper()
		req := httptest.NewRequest("POST", "/", nil)
		req.Header.Set("X-Org", "acme")
		req.Header.Set("X-User", user)
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	if c1, c2 := do("bob", "a"), do("bob", "a"); c1 != http.StatusOK || c2 != http.StatusOK {
		t.Fatalf("a and its retry: %d, %d", c1, c2)
	}
	if len(replayed) != 2 || replayed[0] || !replayed[1] {
		t.Fatalf("handlers saw every level replayed: %v, want [false true]", replayed)
	}
	// carol's first request takes the inner limit's 3 units; her second
	// (another key) is refused inside, and given back at both levels.
	if c := do("carol", "b"); c != http.StatusOK {
		t.Fatalf("carol's b: %d", c)
	}
	if c := do("carol", "c"); c != http.StatusTooManyRequests {
		t.Fatalf("carol's c: %d, want 429 from inside", c)
	}
	for _, c := range []struct {
		lim  pglimit.Limiter
		key  string
		want int
	}{{org, "acme", 0}, {user, "bob", 1}, {user, "carol", 1}} {
		if d, err := c.lim.Peek(t.Context(), c.key, 1); err != nil || !d.Allowed || d.Remaining != c.want {
			t.Errorf("%s %s has %d left after one more (%v), want %d: a and b charged once each, c given back", c.lim.Policy().Namespace, c.key, d.Remaining, err, c.want)
		}
	}
}

// With MaxDelay, a held request's Idempotency-Key keeps its slot: a retry
// after it was served is replayed at once and charged nothing.
func TestIdempotencyKeyHeld(t *testing.T) {
	t.Parallel()
	const period = time.Second
	lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: testdb.Schema(t), Limits: []pglimit.Limit{{Name: "api", Rate: 1, Period: period, Burst: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimithttp.Middleware(lim, &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User"), IdempotencyKey: true, MaxDelay: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d, _ := pglimithttp.DecisionFrom(r.Context()); d.Replayed {
			w.Header().Set("X-Replayed", "1")
		}
	}))
	do := func(key string) (*httptest.ResponseRecorder, time.Duration) {
		t.Helper()
		req := httptest.NewRequest("POST", "/", nil)
		req.Header.Set("X-User", "bob")
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(rec, req)
		return rec, time.Since(start)
	}
	if rec, _ := do("a"); rec.Code != http.StatusOK {
		t.Fatalf("a: %d", rec.Code)
	}
	if rec, took := do("b"); rec.Code != http.StatusOK || took < period/2 {
		t.Fatalf("b: %d after %s, want 200 after being held about %s", rec.Code, took, period)
	}
	if rec, took := do("b"); rec.Code != http.StatusOK || rec.Header().Get("X-Replayed") != "1" || took >= period/2 {
		t.Fatalf("retry of b: %d, replayed %q, after %s; want 200, replayed, at once", rec.Code, rec.Header().Get("X-Replayed"), took)
	}
	// Two slots were taken, not three: the next is at most a period away.
	if d, err := lim.Peek(t.Context(), "bob", 1); err != nil || d.Allowed || d.RetryAfter > period*3/2 {
		t.Fatalf("after a, b and b's retry: %+v, %v; want the next slot within %s", d, err, period*3/2)
	}
}

// A request with an Idempotency-Key that a middleware inside refuses is
// given back by its id: the outer limit keeps nothing, and a retry of it,
// replayed, takes nothing either.
func TestIdempotencyKeyRefusedInside(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	outerLim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "outer", Limits: []pglimit.Limit{{Name: "outer", Rate: 3, Period: time.Hour, Burst: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	innerLim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "inner", Limits: []pglimit.Limit{{Name: "inner", Rate: 1, Period: time.Hour, Burst: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	outer, err := pglimithttp.Middleware(outerLim, &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User"), IdempotencyKey: true})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := pglimithttp.Middleware(innerLim, &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User")})
	if err != nil {
		t.Fatal(err)
	}
	h := outer(inner(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	if _, err := innerLim.Allow(t.Context(), "bob"); err != nil { // the inner limit is spent
		t.Fatal(err)
	}
	for i := range 2 {
		req := httptest.NewRequest("POST", "/", nil)
		req.Header.Set("X-User", "bob")
		req.Header.Set("Idempotency-Key", `"order-1"`)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusTooManyRequests {
			t.Fatalf("request %d: %d, want the inner 429", i, rec.Code)
		}
		if d, err := outerLim.Peek(t.Context(), "bob", 1); err != nil || d.Remaining != 2 {
			t.Fatalf("after request %d the outer limit has %d left after one more (%v), want 2: its charge was not given back", i, d.Remaining, err)
		}
	}
}

// With Settle, a request with an Idempotency-Key is settled by its id at
// the cost its handler reports; its retry, replayed, is not settled
// again.
func TestIdempotencyKeySettle(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: testdb.Schema(t), Limits: []pglimit.Limit{{Name: "tokens", Rate: 10, Period: time.Hour, Burst: 10, Debt: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimithttp.Middleware(lim, &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User"), IdempotencyKey: true, Settle: true})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pglimithttp.SetCost(r.Context(), 4)
	}))
	for i := range 2 {
		req := httptest.NewRequest("POST", "/", nil)
		req.Header.Set("X-User", "bob")
		req.Header.Set("Idempotency-Key", "job-7")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
		if d, err := lim.Peek(t.Context(), "bob", 1); err != nil || d.Remaining != 5 {
			t.Fatalf("after request %d bob has %d left after one more (%v), want 5: settled at 4 once", i, d.Remaining, err)
		}
	}
}
