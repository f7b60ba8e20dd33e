package pglimithttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// answerSlack is the stated bound past the limiter's Timeout within which
// a request whose decision cannot finish is answered: the time to hear the
// server's error or to give up on the connection, and room for a loaded
// machine.
const answerSlack = 500 * time.Millisecond

// layer is a middleware of this package over a limiter or a semaphore of
// Timeout faultTimeout on a pool.
type layer struct {
	name  string
	table string // holds the keys
	build func(t *testing.T, pool *pgxpool.Pool, schema string, cfg *pglimithttp.Config) func(http.Handler) http.Handler
	// lockRow: a long transaction holding the key's row makes a decision
	// wait; a semaphore skips a locked slot instead (a refusal), and waits
	// on a locked table.
	lockRow bool
	// retryAfter is the 503's Retry-After: the shortest interval between
	// two units of any limit, or 1 s for a semaphore.
	retryAfter string
}

const faultTimeout = 200 * time.Millisecond

var layers = []layer{
	{name: "Middleware", table: "pglimit_upsert", lockRow: true, retryAfter: "36", build: func(t *testing.T, pool *pgxpool.Pool, schema string, cfg *pglimithttp.Config) func(http.Handler) http.Handler {
		lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Timeout: faultTimeout,
			Limits: []pglimit.Limit{{Name: "hourly", Rate: 100, Period: time.Hour, Burst: 100}}})
		if err != nil {
			t.Fatal(err)
		}
		mw, err := pglimithttp.Middleware(lim, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return mw
	}},
	{name: "Concurrency", table: "pglimit_slots", retryAfter: "1", build: func(t *testing.T, pool *pgxpool.Pool, schema string, cfg *pglimithttp.Config) func(http.Handler) http.Handler {
		sem, err := pglimitsem.New(pool, &pglimitsem.Config{Schema: schema, Slots: 2, TTL: time.Minute, Timeout: faultTimeout})
		if err != nil {
			t.Fatal(err)
		}
		mw, err := pglimithttp.Concurrency(sem, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return mw
	}},
}

// faultServer serves l, keyed by the X-User header, on a real server on
// 127.0.0.1, and returns a function that sends a request with the header
// and returns the answer, with the body read, and the events.
func faultServer(t *testing.T, l layer, pool *pgxpool.Pool, schema string) (send func(user string) *http.Response, b *testBundle) {
	t.Helper()
	b = &testBundle{}
	cfg := &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User"), OnDecision: func(_ *http.Request, ev pglimithttp.Event) {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.events = append(b.events, ev)
	}}
	srv := httptest.NewServer(l.build(t, pool, schema, cfg)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "done\n") })))
	t.Cleanup(srv.Close)
	return func(user string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), "GET", srv.URL+"/export", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-User", user)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}, b
}

// A request whose decision cannot finish, on a key whose row (or, for a
// semaphore, table) a long transaction holds, or on connections gone
// silent, is answered within the limiter's Timeout plus answerSlack with
// the documented failure answer: 503 with Retry-After, the event saying
// why (ErrTimeout).
func TestFaultAnsweredWithinTimeout(t *testing.T) {
	t.Parallel()
	for _, l := range layers {
		for _, fault := range []string{"locked", "stalled connection"} {
			t.Run(l.name+"/"+fault, func(t *testing.T) {
				t.Parallel()
				schema := testdb.Schema(t)
				pool := testdb.Pool(t)
				var proxy *testdb.StallProxy
				if fault != "locked" {
					proxy, pool = testdb.StallPool(t)
				}
				send, b := faultServer(t, l, pool, schema)
				// Before the fault, the short Timeout may run out while a
				// loaded machine dials the first connection: a 503 then is
				// asked again, as testdb.Ready does for a limiter.
				resp := send("alice")
				for try := 1; try < 10 && resp.StatusCode == http.StatusServiceUnavailable; try++ {
					resp = send("alice")
				}
				if resp.StatusCode != 200 {
					t.Fatalf("before the fault: %d", resp.StatusCode)
				}
				if proxy != nil {
					proxy.Stall()
					t.Cleanup(proxy.Unstall)
				} else {
					if l.lockRow {
						testdb.Lock(t, testdb.Pool(t), schema, l.table, "alice")
					} else {
						testdb.Lock(t, testdb.Pool(t), schema, l.table)
					}
				}
				start := time.Now()
				resp = send("alice")
				if took := time.Since(start); took > faultTimeout+answerSlack {
					t.Errorf("answered after %s; Timeout %s", took.Round(time.Millisecond), faultTimeout)
				}
				if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != l.retryAfter {
					t.Errorf("status %d, Retry-After %q; want 503 and %s", resp.StatusCode, resp.Header.Get("Retry-After"), l.retryAfter)
				}
				if ev := b.lastEvent(t); ev.Outcome != pglimithttp.OutcomeUnavailable || !errors.Is(ev.Err, pglimit.ErrTimeout) {
					t.Errorf("event %+v, want OutcomeUnavailable with ErrTimeout", ev)
				}
			})
		}
	}
}

// A key function's key that pglimit would reject (empty, 300 bytes, not
// UTF-8), read from a header by a real server, is answered with the
// documented 400 and consumes nothing: the table is as it was.
func TestBadHeaderKeyAnswered400(t *testing.T) {
	t.Parallel()
	for _, l := range layers {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			schema := testdb.Schema(t)
			pool := testdb.Pool(t)
			send, b := faultServer(t, l, pool, schema)
			if resp := send("alice"); resp.StatusCode != 200 {
				t.Fatalf("a valid key: %d", resp.StatusCode)
			}
			before := tableRows(t, pool, schema, l.table)
			for name, key := range map[string]string{
				"empty":      "",
				"blank":      "   ",
				"300 bytes":  strings.Repeat("k", 300),
				"not UTF-8":  "\xff",
				"cut UTF-8":  "caf\xc3",
				"overlong /": "\xc0\xaf",
			} {
				resp := send(key)
				if resp.StatusCode != 400 {
					t.Errorf("%s: status %d, want 400", name, resp.StatusCode)
				}
				if ev := b.lastEvent(t); ev.Outcome != pglimithttp.OutcomeBadKey {
					t.Errorf("%s: event %+v, want OutcomeBadKey", name, ev)
				}
			}
			if after := tableRows(t, pool, schema, l.table); after != before {
				t.Errorf("bad keys changed the table:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// tableRows is every row of table in schema, as text.
func tableRows(t *testing.T, pool *pgxpool.Pool, schema, table string) string {
	t.Helper()
	var s string
	q := "SELECT coalesce(string_agg(t::text, ' ' ORDER BY t::text), '') FROM " + pgx.Identifier{schema, table}.Sanitize() + " AS t"
	if err := pool.QueryRow(context.Background(), q).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}
