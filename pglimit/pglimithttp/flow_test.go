package pglimithttp_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// flowOf is the flow of a request: X-User, weighted by X-Weight.
func flowOf(r *http.Request) (pglimitsem.Flow, error) {
	w, err := strconv.Atoi(r.Header.Get("X-Weight"))
	if err != nil {
		return pglimitsem.Flow{}, err
	}
	return pglimitsem.Flow{Name: r.Header.Get("X-User"), Weight: w}, nil
}

// With a FlowFunc, requests wait for the two slots of a shared key and
// are served by fair share: flow a holds one slot throughout, so when
// the other is released a waiter of flow b, which holds none, goes before
// an earlier waiter of flow a. A bad flow is a 400.
func TestConcurrencyFlows(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	sem, err := pglimitsem.New(pool, &pglimitsem.Config{Schema: schema, Slots: 2, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	held, err := sem.WaitFlow(t.Context(), "exports", pglimitsem.Flow{Name: "a", Weight: 1})
	if err != nil || !held.Acquired {
		t.Fatalf("WaitFlow: %+v, %v", held, err)
	}
	limit, err := pglimithttp.Concurrency(sem, &pglimithttp.Config{
		KeyFunc:  func(*http.Request) (string, error) { return "exports", nil },
		FlowFunc: flowOf,
		FlowWait: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	inside, release := make(chan string), make(chan struct{})
	srv := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inside <- r.Header.Get("X-User") + "/" + r.Header.Get("X-N")
		<-release
	})))
	t.Cleanup(srv.Close)
	get := func(user, n, weight string) <-chan int {
		done := make(chan int, 1)
		go func() {
			req, _ := http.NewRequest("GET", srv.URL, nil)
			req.Header.Set("X-User", user)
			req.Header.Set("X-N", n)
			req.Header.Set("X-Weight", weight)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		return done
	}
	queued := func(n int) func() bool {
		return func() bool { return waitersOf(t, pool, schema) == n }
	}
	first := get("a", "1", "1")
	if who := <-inside; who != "a/1" {
		t.Fatalf("inside: %s, want a/1", who)
	}
	second := get("a", "2", "1")
	waitUntil(t, "a/2 waits", queued(1))
	third := get("b", "1", "1")
	waitUntil(t, "b/1 waits", queued(2))
	release <- struct{}{}
	var order []string
	for range 2 {
		order = append(order, <-inside)
		release <- struct{}{}
	}
	if order[0] != "b/1" || order[1] != "a/2" {
		t.Errorf("served %v, want [b/1 a/2]: flow b holds nothing, flow a a slot", order)
	}
	for _, c := range []<-chan int{first, second, third} {
		if code := <-c; code != http.StatusOK {
			t.Errorf("status %d, want 200", code)
		}
	}

	// Bad flows are 400, and nothing waits.
	for _, weight := range []string{"0", "x", "10001"} {
		if code := <-get("a", "bad", weight); code != http.StatusBadRequest {
			t.Errorf("weight %q: %d, want 400", weight, code)
		}
	}
	if n := waitersOf(t, pool, schema); n != 0 {
		t.Errorf("%d waiting after bad flows, want 0", n)
	}
}

// A request that waits past FlowWait is refused as a busy one is.
func TestConcurrencyFlowWaitEnds(t *testing.T) {
	t.Parallel()
	sem := newSemaphore(t, 1, time.Minute)
	limit, err := pglimithttp.Concurrency(sem, &pglimithttp.Config{
		KeyFunc: func(*http.Request) (string, error) { return "exports", nil }, FlowFunc: flowOf, FlowWait: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	slot, err := sem.Acquire(t.Context(), "exports")
	if err != nil || !slot.Acquired {
		t.Fatalf("Acquire: %+v, %v", slot, err)
	}
	srv := httptest.NewServer(limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	t.Cleanup(srv.Close)
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set("X-User", "a")
	req.Header.Set("X-Weight", "1")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("after FlowWait: %d, Retry-After %q; want 429 with one", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("refused after %s, before FlowWait", took)
	}
}

// A request of a level that waits past FlowWait is refused as a busy one
// is.
func TestConcurrencyLevelWaitEnds(t *testing.T) {
	t.Parallel()
	sem, err := pglimitsem.New(testdb.Pool(t), &pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1, TTL: time.Minute,
		Levels: []pglimitsem.Level{{Name: "batch", Max: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	limit, err := pglimithttp.Concurrency(sem, &pglimithttp.Config{
		KeyFunc:   func(*http.Request) (string, error) { return "exports", nil },
		LevelFunc: func(*http.Request) (string, error) { return "batch", nil },
		FlowWait:  300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	slot, err := sem.AcquireLevel(t.Context(), "exports", "batch")
	if err != nil || !slot.Acquired {
		t.Fatalf("AcquireLevel: %+v, %v", slot, err)
	}
	srv := httptest.NewServer(limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	t.Cleanup(srv.Close)
	start := time.Now()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("after FlowWait: %d, Retry-After %q; want 429 with one", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("refused after %s, before FlowWait", took)
	}
}

// FlowFunc, FlowWait and LevelFunc are for Concurrency only, and FlowWait needs a
// FlowFunc or a LevelFunc and must not be negative.
func TestConcurrencyFlowConfigErrors(t *testing.T) {
	t.Parallel()
	sem := newSemaphore(t, 1, time.Minute)
	lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: testdb.Schema(t), Limits: []pglimit.Limit{{Name: "l", Rate: 1, Period: time.Second, Burst: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"Middleware with a FlowFunc":             second(pglimithttp.Middleware(lim, &pglimithttp.Config{FlowFunc: flowOf})),
		"Middleware with a LevelFunc":            second(pglimithttp.Middleware(lim, &pglimithttp.Config{LevelFunc: func(*http.Request) (string, error) { return "", nil }})),
		"FlowWait without FlowFunc or LevelFunc": second(pglimithttp.Concurrency(sem, &pglimithttp.Config{FlowWait: time.Second})),
		"negative FlowWait":                      second(pglimithttp.Concurrency(sem, &pglimithttp.Config{FlowFunc: flowOf, FlowWait: -1})),
	} {
		if !errors.Is(err, pglimithttp.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// With a LevelFunc, a request waits for a slot of its level: with batch
// in its one slot, a second batch request waits, while critical's kept
// slot lets a critical request in, not behind it; the batch request gets
// in once the first releases. An unknown level is a 400.
func TestConcurrencyLevels(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	sem, err := pglimitsem.New(pool, &pglimitsem.Config{Schema: schema, Slots: 2, TTL: time.Minute, Levels: []pglimitsem.Level{
		{Name: "critical", Min: 1, Max: 2}, {Name: "batch", Max: 2},
	}})
	if err != nil {
		t.Fatal(err)
	}
	limit, err := pglimithttp.Concurrency(sem, &pglimithttp.Config{
		KeyFunc:   func(*http.Request) (string, error) { return "api", nil },
		LevelFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-Level"), nil },
		FlowWait:  time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	inside, release := make(chan string), make(chan struct{})
	srv := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inside <- r.Header.Get("X-Level")
		<-release
	})))
	t.Cleanup(srv.Close)
	get := func(level string) <-chan int {
		done := make(chan int, 1)
		go func() {
			req, _ := http.NewRequest("GET", srv.URL, nil)
			req.Header.Set("X-Level", level)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		return done
	}
	first := get("batch")
	<-inside
	second := get("batch")
	waitUntil(t, "the second batch request waits", func() bool { return waitersOf(t, pool, schema) == 1 })
	critical := get("critical")
	if who := <-inside; who != "critical" {
		t.Errorf("inside: %s, want critical", who)
	}
	if code := <-get("nightly"); code != http.StatusBadRequest {
		t.Errorf("an unknown level: %d, want 400", code)
	}
	select {
	case code := <-second:
		t.Errorf("the second batch request, with batch's slot held: %d, want it to wait", code)
	default:
	}
	close(release)
	if who := <-inside; who != "batch" {
		t.Errorf("inside: %s, want batch", who)
	}
	for _, c := range []<-chan int{first, critical, second} {
		if code := <-c; code != http.StatusOK {
			t.Errorf("status %d, want 200", code)
		}
	}
	if _, err := pglimithttp.Concurrency(sem, &pglimithttp.Config{LevelFunc: func(*http.Request) (string, error) { return "", nil }, FlowFunc: flowOf}); !errors.Is(err, pglimithttp.ErrInvalidConfig) {
		t.Errorf("LevelFunc and FlowFunc: %v, want ErrInvalidConfig", err)
	}
}

func second[T any](_ T, err error) error { return err }

// waitersOf counts the live places in schema's queue of semaphore waiters.
func waitersOf(t *testing.T, db pglimit.DB, schema string) int {
	t.Helper()
	var n int
	q := "SELECT count(*) FROM " + pgx.Identifier{schema, "pglimit_slot_waiters"}.Sanitize() + " WHERE expires_at > clock_timestamp()"
	if err := db.QueryRow(t.Context(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitUntil polls cond until it holds, failing the test after 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
	}
}
