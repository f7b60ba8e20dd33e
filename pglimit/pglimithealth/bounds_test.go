package pglimithealth_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// Status from a database that cannot be reached is ErrUnavailable.
func TestStatusUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@"+addr+"/none?connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pglimithealth.Status(t.Context(), pool, "", ""); !errors.Is(err, pglimit.ErrUnavailable) {
		t.Errorf("Status from a closed port: %v, want ErrUnavailable", err)
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

// A role without pg_read_all_stats would read every signal low (other
// roles' sessions and the standbys' lag are hidden from it): its throttle
// never leads, never samples, and says why in its log.
func TestRoleWithoutStats(t *testing.T) {
	ctx := t.Context()
	schema := testdb.Schema(t)
	super := testdb.Pool(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "health_" + hex.EncodeToString(b[:])
	for _, stmt := range []string{
		"CREATE ROLE " + role + " LOGIN PASSWORD 'pglimit'",
		fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", pgx.Identifier{schema}.Sanitize(), role),
		fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA %s TO %s", pgx.Identifier{schema}.Sanitize(), role),
	} {
		if _, err := super.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = super.Exec(context.Background(), fmt.Sprintf("DROP OWNED BY %s", role))
		_, _ = super.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	pc, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.User, pc.ConnConfig.Password = role, "pglimit"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	var log syncBuffer
	samples := make(chan pglimithealth.State, 100)
	cfg := healthy(schema, samples)
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	th := start(t, pool, cfg)
	for deadline := time.Now().Add(patience); !strings.Contains(log.String(), "pg_read_all_stats"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line names pg_read_all_stats: %s", log.String())
		}
	}
	time.Sleep(5 * cfg.Period)
	if th.Leader() || len(samples) != 0 {
		t.Errorf("a role without pg_read_all_stats: leader %t, %d samples; want neither", th.Leader(), len(samples))
	}
	if st, err := pglimithealth.Status(ctx, super, schema, ""); err != nil || len(st) != 0 {
		t.Errorf("Status: %v, %v; want nothing written", st, err)
	}
	// Granted it, the same role leads and samples.
	if _, err := super.Exec(ctx, "GRANT pg_read_all_stats TO "+role); err != nil {
		t.Fatal(err)
	}
	nextSample(t, samples, "once granted", func(pglimithealth.State) bool { return true })
}

// syncBuffer is a log's buffer, written by the throttle's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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
