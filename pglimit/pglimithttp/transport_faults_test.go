package pglimithttp_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
)

// transportBound is a request's deadline in these tests: its context's,
// or the budget's Timeout.
const transportBound = 100 * time.Millisecond

// transportCase is a Transport, waiting its turn or failing fast, whose
// requests are bounded by their context (100 ms, the budget's Timeout
// 2 s) or by the budget's Timeout (100 ms, under a 5 s context).
type transportCase struct {
	name     string
	key      string // the budget's key of every request
	client   *http.Client
	timeout  bool  // the bound is Timeout
	want     error // the error of a request not decided in time
	calls    int
	latest   time.Duration // the most a request took past its bound
	mistakes []string
}

// transportCases readies a Transport of each kind on pools that newPool
// returns, in schema, each with a key of its own that has a row: its
// first request went out.
func transportCases(t *testing.T, up *upstream, newPool func() *pgxpool.Pool, schema string) []*transportCase {
	t.Helper()
	var cases []*transportCase
	for _, failFast := range []bool{false, true} {
		for _, bound := range []string{"context", "Timeout"} {
			c := &transportCase{name: fmt.Sprintf("failfast=%t/%s", failFast, bound), want: context.DeadlineExceeded}
			c.key = fmt.Sprintf("deadline-%t-%s", failFast, bound)
			timeout := 2 * time.Second
			if bound == "Timeout" {
				c.timeout, c.want, timeout = true, pglimit.ErrTimeout, transportBound
			}
			lim, err := pglimit.New(newPool(), &pglimit.Config{Schema: schema, Namespace: "deadline", Timeout: timeout,
				Limits: []pglimit.Limit{{Rate: 100, Period: time.Second, Burst: 100}}})
			if err != nil {
				t.Fatal(err)
			}
			tr, err := pglimithttp.NewTransport(&pglimithttp.TransportConfig{Limiter: lim, FailFast: failFast,
				Key: func(*http.Request) (string, error) { return c.key, nil }})
			if err != nil {
				t.Fatal(err)
			}
			c.client = &http.Client{Transport: tr}
			if err := testdb.Ready(func() error { return c.send(context.Background(), up) }); err != nil {
				t.Fatalf("%s: before the fault: %v", c.name, err)
			}
			cases = append(cases, c)
		}
	}
	return cases
}

func (c *transportCase) send(ctx context.Context, up *upstream) error {
	req, err := http.NewRequestWithContext(ctx, "GET", up.srv.URL+"/"+c.key, nil)
	if err != nil {
		return err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// run sends three requests at once and checks that each returned by its
// bound plus answerSlack with an error wrapping want, unsent.
func (c *transportCase) run(up *upstream) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if !c.timeout {
				ctx, cancel = context.WithTimeout(context.Background(), transportBound)
			}
			defer cancel()
			start := time.Now()
			err := c.send(ctx, up)
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			c.calls++
			c.latest = max(c.latest, took-transportBound)
			switch {
			case took > transportBound+answerSlack:
				c.mistakes = append(c.mistakes, fmt.Sprintf("returned after %s, deadline %s (err %v)", took.Round(time.Millisecond), transportBound, err))
			case err == nil:
				c.mistakes = append(c.mistakes, "sent with its budget's database out of reach")
			case !errors.Is(err, c.want):
				c.mistakes = append(c.mistakes, fmt.Sprintf("%v, want an error wrapping %v", err, c.want))
			}
		})
	}
	wg.Wait()
}

// runTransportCases runs every case at once, checks that the upstream
// saw no request beyond the cases' first ones, and logs how late the
// latest request returned past its bound.
func runTransportCases(t *testing.T, up *upstream, cases []*transportCase) {
	t.Helper()
	before := len(up.seen())
	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Go(func() { c.run(up) })
	}
	wg.Wait()
	calls, latest := 0, time.Duration(0)
	for _, c := range cases {
		for _, m := range c.mistakes {
			t.Errorf("%s: %s", c.name, m)
		}
		calls, latest = calls+c.calls, max(latest, c.latest)
	}
	if n := len(up.seen()); n != before {
		t.Errorf("the upstream saw %d requests during the fault", n-before)
	}
	t.Logf("%d requests; the latest returned %s past its bound", calls, latest.Round(time.Millisecond))
}

// A Transport's request whose budget's row a long transaction holds
// returns by its deadline (its context's, or the budget's Timeout) plus
// answerSlack, unsent, with the context's error or ErrTimeout: waiting
// its turn and failing fast.
func TestTransportDeadlineLockedRow(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 1000, 1000)
	schema := testdb.Schema(t)
	cases := transportCases(t, up, func() *pgxpool.Pool { return testdb.Pool(t) }, schema)
	keys := make([]string, len(cases))
	for i, c := range cases {
		keys[i] = c.key
	}
	testdb.Lock(t, testdb.Pool(t), schema, "pglimit_upsert", keys...)
	runTransportCases(t, up, cases)
}

// The same on a server stopped with SIGSTOP: connections stay open, and
// nothing comes back on them.
func TestTransportDeadlineFrozenServer(t *testing.T) {
	testdb.Slow(t)
	up := newUpstream(t, 1000, 1000)
	srv := testdb.OwnMigratedServer(t)
	cases := transportCases(t, up, func() *pgxpool.Pool { return testdb.ServerPool(t, srv, 4) }, "public")
	testdb.Frozen(t, srv)
	runTransportCases(t, up, cases)
}

// The same on dead connections: every connection to the server, those in
// the pools and those dialled during the requests, goes silent.
func TestTransportDeadlineDeadConnection(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 1000, 1000)
	proxy, pcfg := testdb.NewStallProxy(t)
	cases := transportCases(t, up, func() *pgxpool.Pool {
		pool, err := pgxpool.NewWithConfig(context.Background(), pcfg.Copy())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}, testdb.Schema(t))
	proxy.Stall()
	t.Cleanup(proxy.Unstall)
	runTransportCases(t, up, cases)
}

// A request answered 429 while the database has gone silent returns the
// answer by its context's deadline plus answerSlack: storing the pause
// for the other instances goes on, within the budget's Timeout, without
// the caller, who has its answer; this instance holds the key back all
// the same.
func TestTransportPauseWithinDeadline(t *testing.T) {
	t.Parallel()
	proxy, pool := testdb.StallPool(t)
	up := newUpstream(t, 1000, 1000)
	up.answer = func(int, *http.Request) (int, string) {
		proxy.Stall() // the database goes silent as the answer comes
		return http.StatusTooManyRequests, "1"
	}
	t.Cleanup(proxy.Unstall)
	lim := budget(t, pool, testdb.Schema(t), 100, 100)
	// The pause, stored after the test's end, finds its schema gone.
	tr, err := pglimithttp.NewTransport(&pglimithttp.TransportConfig{Limiter: lim, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", up.srv.URL+"/", nil)
	start := time.Now()
	resp, err := client.Do(req)
	took := time.Since(start)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the request answered 429: %v, %v", resp, err)
	}
	resp.Body.Close()
	if took > 300*time.Millisecond+answerSlack {
		t.Errorf("the 429 was returned after %s; the request's deadline was 300ms", took.Round(time.Millisecond))
	}
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ = http.NewRequestWithContext(ctx, "GET", up.srv.URL+"/", nil)
	if _, err := client.Do(req); !errors.Is(err, pglimithttp.ErrThrottled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a request 200ms from its deadline after the 429 of Retry-After: 1: %v; want a ThrottledError of the pause", err)
	}
	if n := len(up.seen()); n != 1 {
		t.Errorf("the upstream saw %d requests, want the first alone", n)
	}
}

// Typed errors: a Transport's request that its budget cannot decide fails
// unsent with an error wrapping the sentinel of the cause, waiting its
// turn and failing fast, and changes nothing: a key pglimit rejects
// (empty, 257 bytes, not UTF-8, NUL: ErrInvalidKey, before the database), the server's lock_timeout or
// statement_timeout on a locked table (ErrTimeout), a server that cannot
// write (ErrReadOnly), and nothing listening (ErrUnavailable).
func TestTransportTypedErrors(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 1000, 1000)
	schema := testdb.Schema(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nowhere := ln.Addr().String()
	ln.Close()
	for _, class := range []struct {
		name   string
		params map[string]string
		url    string // the pool's, instead of the test server's
		lock   bool
		keys   []string
		want   error
	}{
		{name: "invalid key", keys: []string{"", strings.Repeat("k", 257), "\xff", "a\x00b"}, want: pglimit.ErrInvalidKey},
		{name: "lock_timeout", params: map[string]string{"lock_timeout": "300ms"}, lock: true, want: pglimit.ErrTimeout},
		{name: "statement_timeout", params: map[string]string{"statement_timeout": "300ms"}, lock: true, want: pglimit.ErrTimeout},
		{name: "read-only", params: map[string]string{"default_transaction_read_only": "on"}, want: pglimit.ErrReadOnly},
		{name: "unavailable", url: "postgres://nobody@" + nowhere + "/none?connect_timeout=2", want: pglimit.ErrUnavailable},
	} {
		t.Run(class.name, func(t *testing.T) {
			url := cmp.Or(class.url, testdb.URL(t))
			pcfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				t.Fatal(err)
			}
			maps.Copy(pcfg.ConnConfig.RuntimeParams, class.params)
			pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			before := tableRows(t, testdb.Pool(t), schema, "pglimit_upsert")
			if class.lock {
				testdb.Lock(t, testdb.Pool(t), schema, "pglimit_upsert")
			}
			keys := class.keys
			if keys == nil {
				keys = []string{"typed-" + class.name}
			}
			sent := len(up.seen())
			for _, failFast := range []bool{false, true} {
				for _, key := range keys {
					lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "typed", Timeout: 5 * time.Second,
						Limits: []pglimit.Limit{{Rate: 100, Period: time.Second, Burst: 100}}})
					if err != nil {
						t.Fatal(err)
					}
					tr, err := pglimithttp.NewTransport(&pglimithttp.TransportConfig{Limiter: lim, FailFast: failFast,
						Key: func(*http.Request) (string, error) { return key, nil }})
					if err != nil {
						t.Fatal(err)
					}
					req, _ := http.NewRequestWithContext(t.Context(), "GET", up.srv.URL+"/", nil)
					if _, err := (&http.Client{Transport: tr}).Do(req); !errors.Is(err, class.want) {
						t.Errorf("failfast=%t, key %q: %v, want an error wrapping %v", failFast, key, err, class.want)
					}
				}
			}
			if n := len(up.seen()); n != sent {
				t.Errorf("the upstream saw %d requests", n-sent)
			}
			if class.lock {
				return // the table is locked until the test's end; lock_timeout refused the writes
			}
			if after := tableRows(t, testdb.Pool(t), schema, "pglimit_upsert"); after != before {
				t.Errorf("the requests changed the table:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}
