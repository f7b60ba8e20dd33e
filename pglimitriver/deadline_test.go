package pglimitriver_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
	"github.com/pglimit/cooldown/pglimitriver"
)

// jobBound is a job's deadline in these tests: its context's (River's
// JobTimeout), or the limiter's and the semaphore's Timeout.
const jobBound = 100 * time.Millisecond

// deadlineSlack is the stated bound past a job's deadline within which
// the middleware returns: the time to hear the server's error or to give
// up on the connection (docs/operations.md, "Bounds every call keeps"),
// with room for a loaded machine.
const deadlineSlack = 500 * time.Millisecond

// jobCase is a Middleware over a limiter, a semaphore or both, whose
// decisions are bounded by the job's context (100 ms; Timeout 2 s) or by
// Timeout (100 ms, under a 5 s context).
type jobCase struct {
	name    string
	kind    string // the jobs' kind: their key
	uses    string // "limiter", "semaphore" or "both"
	mw      *pglimitriver.Middleware
	timeout bool
	want    error

	mu       sync.Mutex
	calls    int
	latest   time.Duration
	mistakes []string
	worked   atomic.Int64
}

// jobCases readies a case of each kind and bound on pools that newPool
// returns, in schema; each key has its rows (a job of it was worked).
func jobCases(t *testing.T, newPool func() *pgxpool.Pool, schema string) []*jobCase {
	t.Helper()
	var cases []*jobCase
	for _, uses := range []string{"limiter", "semaphore", "both"} {
		for _, bound := range []string{"context", "Timeout"} {
			c := &jobCase{name: uses + "/" + bound, kind: "deadline-" + uses + "-" + bound, uses: uses, want: context.DeadlineExceeded}
			timeout := 2 * time.Second
			if bound == "Timeout" {
				c.timeout, c.want, timeout = true, pglimit.ErrTimeout, jobBound
			}
			pool := newPool()
			var cfg pglimitriver.Config
			if uses != "semaphore" {
				lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Timeout: timeout,
					Limits: []pglimit.Limit{{Rate: 100, Period: time.Second, Burst: 100}}})
				if err != nil {
					t.Fatal(err)
				}
				cfg.Limiter = lim
			}
			if uses != "limiter" {
				sem, err := pglimitsem.New(pool, &pglimitsem.Config{Schema: schema, Slots: 4, TTL: time.Minute, Timeout: timeout})
				if err != nil {
					t.Fatal(err)
				}
				cfg.Semaphore = sem
			}
			mw, err := pglimitriver.NewMiddleware(&cfg)
			if err != nil {
				t.Fatal(err)
			}
			c.mw = mw
			if err := testdb.Ready(func() error { return c.work(context.Background()) }); err != nil {
				t.Fatalf("%s: before the fault: %v", c.name, err)
			}
			c.worked.Store(0)
			cases = append(cases, c)
		}
	}
	return cases
}

func (c *jobCase) work(ctx context.Context) error {
	return c.mw.Work(ctx, &rivertype.JobRow{Kind: c.kind}, func(context.Context) error {
		c.worked.Add(1)
		return nil
	})
}

// run works three jobs at once and checks that each returned by its bound
// plus deadlineSlack with an error wrapping want, its work not done.
func (c *jobCase) run() {
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if !c.timeout {
				ctx, cancel = context.WithTimeout(context.Background(), jobBound)
			}
			defer cancel()
			start := time.Now()
			err := c.work(ctx)
			took := time.Since(start)
			c.mu.Lock()
			defer c.mu.Unlock()
			c.calls++
			c.latest = max(c.latest, took-jobBound)
			switch {
			case took > jobBound+deadlineSlack:
				c.mistakes = append(c.mistakes, fmt.Sprintf("returned after %s, deadline %s (err %v)", took.Round(time.Millisecond), jobBound, err))
			case !errors.Is(err, c.want):
				c.mistakes = append(c.mistakes, fmt.Sprintf("%v, want an error wrapping %v", err, c.want))
			}
		})
	}
	wg.Wait()
}

// runJobCases runs every case at once and checks them.
func runJobCases(t *testing.T, cases []*jobCase) {
	t.Helper()
	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Go(c.run)
	}
	wg.Wait()
	calls, latest := 0, time.Duration(0)
	for _, c := range cases {
		for _, m := range c.mistakes {
			t.Errorf("%s: %s", c.name, m)
		}
		if n := c.worked.Load(); n != 0 {
			t.Errorf("%s: %d jobs worked during the fault", c.name, n)
		}
		calls, latest = calls+c.calls, max(latest, c.latest)
	}
	t.Logf("%d jobs; the latest returned %s past its bound", calls, latest.Round(time.Millisecond))
}

// A job whose limiter's row a long transaction holds, or whose
// semaphore's table one holds, returns by its deadline (its context's,
// or Timeout) plus deadlineSlack, unworked, with the context's error or
// ErrTimeout: River retries it. With both, the semaphore's wait comes
// after the limiter admitted the job, whose units are given back.
func TestDeadlineLocked(t *testing.T) {
	t.Parallel()
	schema := testdb.Schema(t)
	cases := jobCases(t, func() *pgxpool.Pool { return testdb.Pool(t) }, schema)
	var limited []string
	for _, c := range cases {
		if c.uses == "limiter" {
			limited = append(limited, c.kind)
		}
	}
	testdb.Lock(t, testdb.Pool(t), schema, "pglimit_upsert", limited...)
	testdb.Lock(t, testdb.Pool(t), schema, "pglimit_slots")
	runJobCases(t, cases)
}

// The same on a server stopped with SIGSTOP.
func TestDeadlineFrozenServer(t *testing.T) {
	testdb.Slow(t)
	srv := testdb.OwnMigratedServer(t)
	cases := jobCases(t, func() *pgxpool.Pool { return testdb.ServerPool(t, srv, 4) }, "public")
	testdb.Frozen(t, srv)
	runJobCases(t, cases)
}

// The same on dead connections: every connection to the server goes
// silent.
func TestDeadlineDeadConnection(t *testing.T) {
	t.Parallel()
	proxy, pcfg := testdb.NewStallProxy(t)
	cases := jobCases(t, func() *pgxpool.Pool {
		pool, err := pgxpool.NewWithConfig(context.Background(), pcfg.Copy())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}, testdb.Schema(t))
	proxy.Stall()
	t.Cleanup(proxy.Unstall)
	runJobCases(t, cases)
}

// A job that its limiter admitted and whose semaphore's statement then
// goes silent returns by its context's deadline plus deadlineSlack even
// when the limiter's database goes silent too: giving the units back goes
// on without the job, within the limiter's Timeout.
func TestDeadlineGiveBack(t *testing.T) {
	t.Parallel()
	schema := testdb.Schema(t)
	limProxy, limPool := testdb.StallPool(t)
	semProxy, semPool := testdb.StallPool(t)
	lim, err := pglimit.New(limPool, &pglimit.Config{Schema: schema, Limits: []pglimit.Limit{{Rate: 100, Period: time.Second, Burst: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	sem, err := pglimitsem.New(semPool, &pglimitsem.Config{Schema: schema, Slots: 4, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Limiter: lim, Semaphore: sem})
	if err != nil {
		t.Fatal(err)
	}
	job := &rivertype.JobRow{Kind: "give-back"}
	if err := mw.Work(t.Context(), job, func(context.Context) error { return nil }); err != nil {
		t.Fatalf("before the fault: %v", err)
	}
	semProxy.Stall()
	t.Cleanup(semProxy.Unstall)
	t.Cleanup(limProxy.Unstall)
	go func() {
		<-semProxy.Held() // the semaphore's statement is stuck: the limiter has admitted
		limProxy.Stall()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = mw.Work(ctx, job, func(context.Context) error {
		t.Error("the job was worked during the fault")
		return nil
	})
	if took := time.Since(start); took > 300*time.Millisecond+deadlineSlack || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the job returned after %s with %v; want context.DeadlineExceeded within %s of its 300ms deadline", took.Round(time.Millisecond), err, deadlineSlack)
	}
}

// Typed errors: a job its middleware cannot decide (over a limiter, a
// semaphore, or both) is not worked, returns an error wrapping the
// sentinel of the cause, and changes nothing: a key or cost pglimit
// rejects (ErrInvalidKey, ErrInvalidCost, before the database; the job is
// cancelled), the server's lock_timeout or statement_timeout on locked
// tables (ErrTimeout), a server that cannot write (ErrReadOnly), and
// nothing listening (ErrUnavailable); River retries those.
func TestTypedErrors(t *testing.T) {
	t.Parallel()
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
		costs  []int
		cancel bool // the job is cancelled (river.JobCancel)
		want   error
	}{
		{name: "invalid key", keys: []string{"", strings.Repeat("k", 257), "\xff", "a\x00b"}, cancel: true, want: pglimit.ErrInvalidKey},
		{name: "invalid cost", costs: []int{0, -1, math.MaxInt, 101}, cancel: true, want: pglimit.ErrInvalidCost},
		{name: "lock_timeout", params: map[string]string{"lock_timeout": "300ms"}, lock: true, want: pglimit.ErrTimeout},
		{name: "statement_timeout", params: map[string]string{"statement_timeout": "300ms"}, lock: true, want: pglimit.ErrTimeout},
		{name: "read-only", params: map[string]string{"default_transaction_read_only": "on"}, want: pglimit.ErrReadOnly},
		{name: "unavailable", url: "postgres://nobody@" + nowhere + "/none?connect_timeout=2", want: pglimit.ErrUnavailable},
	} {
		t.Run(class.name, func(t *testing.T) {
			t.Parallel()
			schema := testdb.Schema(t)
			url := class.url
			if url == "" {
				url = testdb.URL(t)
			}
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
			plain := testdb.Pool(t)
			before := rows(t, plain, schema)
			if class.lock {
				testdb.Lock(t, testdb.Pool(t), schema, "pglimit_upsert")
				testdb.Lock(t, testdb.Pool(t), schema, "pglimit_slots")
			}
			keys, costs := class.keys, class.costs
			if keys == nil {
				keys = []string{"typed"}
			}
			if costs == nil {
				costs = []int{1}
			}
			for _, uses := range []string{"limiter", "semaphore", "both"} {
				if costs[0] != 1 && uses == "semaphore" {
					continue // a semaphore has no cost
				}
				for _, key := range keys {
					for _, cost := range costs {
						cfg := pglimitriver.Config{
							Key:  func(*rivertype.JobRow) (string, error) { return key, nil },
							Cost: func(*rivertype.JobRow) (int, error) { return cost, nil },
						}
						if uses != "semaphore" {
							if cfg.Limiter, err = pglimit.New(pool, &pglimit.Config{Schema: schema, Timeout: 5 * time.Second,
								Limits: []pglimit.Limit{{Rate: 100, Period: time.Second, Burst: 100}}}); err != nil {
								t.Fatal(err)
							}
						}
						if uses != "limiter" {
							if cfg.Semaphore, err = pglimitsem.New(pool, &pglimitsem.Config{Schema: schema, Slots: 4, TTL: time.Minute, Timeout: 5 * time.Second}); err != nil {
								t.Fatal(err)
							}
						}
						mw, err := pglimitriver.NewMiddleware(&cfg)
						if err != nil {
							t.Fatal(err)
						}
						err = mw.Work(t.Context(), &rivertype.JobRow{Kind: "typed"}, func(context.Context) error {
							t.Errorf("%s: key %q, cost %d: the job was worked", uses, key, cost)
							return nil
						})
						var cancelled *river.JobCancelError
						switch {
						case !errors.Is(err, class.want):
							t.Errorf("%s: key %q, cost %d: %v, want an error wrapping %v", uses, key, cost, err, class.want)
						case errors.As(err, &cancelled) != class.cancel:
							t.Errorf("%s: key %q, cost %d: %v; cancelled %t, want %t", uses, key, cost, err, !class.cancel, class.cancel)
						}
					}
				}
			}
			if class.lock {
				return // the tables are locked until the test's end; the server's timeout refused the writes
			}
			if after := rows(t, plain, schema); after != before {
				t.Errorf("the jobs changed the tables:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// rows is every row of schema's limiter and semaphore tables, as text.
func rows(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	var b strings.Builder
	for _, table := range []string{"pglimit_upsert", "pglimit_slots", "pglimit_slot_waiters"} {
		var s string
		q := "SELECT coalesce(string_agg(t::text, ' ' ORDER BY t::text), '') FROM " + pgx.Identifier{schema, table}.Sanitize() + " AS t"
		if err := pool.QueryRow(context.Background(), q).Scan(&s); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s: %s\n", table, s)
	}
	return b.String()
}

// A job whose connections go silent while it works returns, once its work
// is done, within twice the semaphore's Timeout (an extension under way,
// then the release) plus deadlineSlack; the slot returns when its lease
// ends.
func TestDeadlineRelease(t *testing.T) {
	t.Parallel()
	const timeout = 200 * time.Millisecond
	proxy, pool := testdb.StallPool(t)
	sem, err := pglimitsem.New(pool, &pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1, TTL: time.Minute, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Semaphore: sem})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Unstall)
	var done time.Time
	err = mw.Work(t.Context(), &rivertype.JobRow{Kind: "release"}, func(context.Context) error {
		proxy.Stall()
		done = time.Now()
		return nil
	})
	if took := time.Since(done); err != nil || took > 2*timeout+deadlineSlack {
		t.Errorf("the job returned %s after its work, with %v; want nil within %s", took.Round(time.Millisecond), err, 2*timeout+deadlineSlack)
	}
}
