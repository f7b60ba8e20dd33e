package pglimithttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

func newSemaphore(t *testing.T, limit int, ttl time.Duration) *pglimitsem.Semaphore {
	t.Helper()
	sem, err := pglimitsem.New(testdb.Pool(t), &pglimitsem.Config{Schema: testdb.Schema(t), Slots: limit, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return sem
}

// concurrencyServer serves a handler that blocks until release is closed,
// behind Concurrency, keyed by the X-User header.
func concurrencyServer(t *testing.T, sem *pglimitsem.Semaphore, inside chan<- struct{}, release <-chan struct{}) *httptest.Server {
	t.Helper()
	limit, err := pglimithttp.Concurrency(sem, &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User")})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inside <- struct{}{}
		<-release
	})))
	t.Cleanup(srv.Close)
	return srv
}

// getAs sends a request of user; a failure is reported, and its response
// has status 0.
func getAs(t *testing.T, url, user string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Error(err)
		return &http.Response{}
	}
	req.Header.Set("X-User", user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return &http.Response{}
	}
	resp.Body.Close()
	return resp
}

// Two slots per user: of five concurrent requests, two run and three are
// 429 with a Retry-After; another user is unaffected, and once the
// handlers return their slots are free again.
func TestConcurrencyMiddleware(t *testing.T) {
	t.Parallel()
	sem := newSemaphore(t, 2, time.Minute)
	inside, release := make(chan struct{}, 10), make(chan struct{})
	srv := concurrencyServer(t, sem, inside, release)

	codes := make(chan *http.Response, 5)
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() { codes <- getAs(t, srv.URL, "alice") })
	}
	<-inside
	<-inside
	refused := 0
	for refused < 3 {
		resp := <-codes
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("a third request of alice: %d, Retry-After %q; want 429 with one", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		refused++
	}
	var bob sync.WaitGroup
	bob.Go(func() { getAs(t, srv.URL, "bob") })
	<-inside // bob is served while alice holds both her slots
	close(release)
	wg.Wait()
	bob.Wait()
	for range 2 {
		if resp := <-codes; resp.StatusCode != http.StatusOK {
			t.Fatalf("a served request of alice: %d", resp.StatusCode)
		}
	}
	var again sync.WaitGroup
	defer again.Wait()
	again.Go(func() {
		if resp := getAs(t, srv.URL, "alice"); resp.StatusCode != http.StatusOK {
			t.Errorf("alice after her handlers returned: %d, want 200", resp.StatusCode)
		}
	})
	select {
	case <-inside:
	case <-time.After(10 * time.Second):
		t.Fatal("alice's slots were not released when her handlers returned")
	}
}

// A handler that runs past the slot's TTL keeps its slot: the middleware
// extends the lease.
func TestConcurrencyMiddlewareExtends(t *testing.T) {
	t.Parallel()
	sem := newSemaphore(t, 1, time.Second)
	inside, release := make(chan struct{}, 10), make(chan struct{})
	srv := concurrencyServer(t, sem, inside, release)
	done := make(chan *http.Response)
	go func() { done <- getAs(t, srv.URL, "alice") }()
	<-inside
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if resp := getAs(t, srv.URL, "alice"); resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("while the first request runs past its TTL: %d, want 429", resp.StatusCode)
		}
	}
	close(release)
	if resp := <-done; resp.StatusCode != http.StatusOK {
		t.Fatalf("the long request: %d", resp.StatusCode)
	}
}

func TestConcurrencyConfigErrors(t *testing.T) {
	t.Parallel()
	if _, err := pglimithttp.Concurrency(nil, nil); !errors.Is(err, pglimithttp.ErrInvalidConfig) {
		t.Errorf("nil semaphore: %v", err)
	}
	sem := newSemaphore(t, 1, time.Minute)
	cost := func(*http.Request) (int, error) { return 1, nil }
	if _, err := pglimithttp.Concurrency(sem, &pglimithttp.Config{CostFunc: cost}); !errors.Is(err, pglimithttp.ErrInvalidConfig) {
		t.Errorf("CostFunc: %v", err)
	}
	if _, err := pglimithttp.Concurrency(sem, &pglimithttp.Config{ExemptKeys: []string{""}}); !errors.Is(err, pglimithttp.ErrInvalidConfig) {
		t.Errorf("bad exempt key: %v", err)
	}
}

// A request refused because every slot is held gets the answer of a rate
// refusal: Retry-After, RateLimit-Policy and RateLimit (the quota unit
// concurrent-requests) and the quota-exceeded problem body. Its wait is the
// semaphore's hint, the slots' observed hold (0.2 s here, so 1 s), not the
// 30 s lease.
func TestConcurrencyRefusal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sem := newSemaphore(t, 1, 30*time.Second)
	s, err := sem.Acquire(ctx, "alice")
	if err != nil || !s.Acquired {
		t.Fatalf("Acquire: %+v, %v", s, err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := sem.Release(ctx, s); err != nil {
		t.Fatal(err)
	}
	inside, release := make(chan struct{}, 1), make(chan struct{})
	srv := concurrencyServer(t, sem, inside, release)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(release)
	wg.Go(func() {
		if resp := getAs(t, srv.URL, "alice"); resp.StatusCode != http.StatusOK ||
			resp.Header.Get("RateLimit-Policy") != `"concurrency";q=1;qu="concurrent-requests"` {
			t.Errorf("the admitted request: %d, RateLimit-Policy %q", resp.StatusCode, resp.Header.Get("RateLimit-Policy"))
		}
	})
	<-inside

	req, err := http.NewRequest("GET", srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-User", "alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Type     string   `json:"type"`
		Status   int      `json:"status"`
		Violated []string `json:"violated-policies"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct{ name, want string }{
		{"Retry-After", "1"},
		{"RateLimit-Policy", `"concurrency";q=1;qu="concurrent-requests"`},
		{"RateLimit", `"concurrency";r=0;t=1`},
		{"Content-Type", "application/problem+json"},
	} {
		if got := resp.Header.Get(h.name); got != h.want {
			t.Errorf("%s: %q, want %q", h.name, got, h.want)
		}
	}
	if resp.StatusCode != http.StatusTooManyRequests || body.Status != 429 ||
		body.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" || len(body.Violated) != 1 || body.Violated[0] != "concurrency" {
		t.Errorf("refusal: %d %+v; want 429 of the quota-exceeded type, violating concurrency", resp.StatusCode, body)
	}
}
