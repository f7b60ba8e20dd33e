package pglimithealth_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithealth"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
)

// slack is what the deadline tests allow past a deadline, for a loaded
// machine, as the library's other deadline tests do.
const slack = 500 * time.Millisecond

// healthy is a throttle whose signal is never over: lock waiters past
// 1000.
func healthy(schema string, samples chan pglimithealth.State) *pglimithealth.Config {
	cfg := throttleConfig(schema, "a", pglimithealth.Signal{Kind: pglimithealth.LockWaiters, Threshold: 1000}, samples)
	cfg.Period = 50 * time.Millisecond
	return cfg
}

// A sample stuck behind a row lock is cancelled by Stop, which returns by
// its context; the leader's session stops waiting, and the rate stays.
func TestStopDuringBlockedSample(t *testing.T) {
	ctx := t.Context()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	samples := make(chan pglimithealth.State, 100)
	th := start(t, pool, healthy(schema, samples))
	nextSample(t, samples, "first", func(pglimithealth.State) bool { return true })

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the test's end
	if _, err := tx.Exec(ctx, fmt.Sprintf("SELECT FROM %s WHERE name = 'bulk' FOR UPDATE",
		pgx.Identifier{schema, "pglimit_health"}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	waiting := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%WITH sample AS%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for deadline := time.Now().Add(patience); waiting() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the sample never waited for the locked row")
		}
	}
	held := status(t, pool, schema)

	const within = 100 * time.Millisecond
	stopCtx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	began := time.Now()
	err = th.Stop(stopCtx)
	if took := time.Since(began); took > within+slack {
		t.Errorf("Stop took %s with a %s context and a sample blocked (err %v)", took, within, err)
	}
	for deadline := time.Now().Add(patience); waiting() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("after Stop the throttle's sample still waits for the row")
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if st := status(t, pool, schema); st.Samples != held.Samples || st.Rate != held.Rate {
		t.Errorf("a cancelled sample changed the state: %v, then %v", held, st)
	}
}

// Status returns by its context, with its error, from a server that
// stopped answering.
func TestStatusDeadline(t *testing.T) {
	schema := testdb.Schema(t)
	proxy, pool := testdb.StallPool(t)
	if _, err := pglimithealth.Status(t.Context(), pool, schema, ""); err != nil {
		t.Fatal(err)
	}
	proxy.Stall()
	defer proxy.Unstall()
	const within = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	began := time.Now()
	_, err := pglimithealth.Status(ctx, pool, schema, "")
	if took := time.Since(began); !errors.Is(err, context.DeadlineExceeded) || took > within+slack {
		t.Errorf("Status against a silent server: %v after %s; want the context's error within %s", err, took, within+slack)
	}
}

// pglimithttp's Transport spends the throttled rate: with the floor and
// the ceiling at 1 a second, the key's own limit, a request 20ms after
// another is refused, where the limiter's own rate of 1000 a second (used
// before the first sample) admits it.
func TestTransportFollowsThrottle(t *testing.T) {
	ctx := t.Context()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	samples := make(chan pglimithealth.State, 100)
	cfg := healthy(schema, samples)
	cfg.Limiter.Limits[0].Rate = 1000
	cfg.Floor, cfg.Ceiling = 1, 1
	lim, err := pglimit.New(pool, cfg.Limiter)
	if err != nil {
		t.Fatal(err)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer upstream.Close()
	tr, err := pglimithttp.NewTransport(&pglimithttp.TransportConfig{
		Limiter: lim, FailFast: true,
		Key: func(*http.Request) (string, error) { return "backfill", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	send := func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	// Before any sample: the limiter's own rate.
	for i := range 2 {
		if err := send(); err != nil {
			t.Fatalf("request %d before the throttle: %v", i, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := lim.Reset(ctx, "backfill"); err != nil {
		t.Fatal(err)
	}
	start(t, pool, cfg)
	nextSample(t, samples, "first", func(pglimithealth.State) bool { return true })
	if err := send(); err != nil {
		t.Fatalf("first request under the throttle: %v", err)
	}
	time.Sleep(20 * time.Millisecond)
	var throttled *pglimithttp.ThrottledError
	if err := send(); !errors.As(err, &throttled) {
		t.Fatalf("a request 20ms later under a throttle of 1 a second: %v, want a ThrottledError", err)
	}
}
