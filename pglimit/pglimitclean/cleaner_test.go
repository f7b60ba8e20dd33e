package pglimitclean_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
	"golang.org/x/sync/errgroup"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
)

// waitTimeout bounds every wait for a cleaner event; it is far above what
// any wait takes, so that a loaded CI machine does not fail the suite.
const waitTimeout = 30 * time.Second

// watch lets a test wait for a condition that cleaner hooks make true:
// hooks poke after every event and the waiter re-checks.
type watch struct {
	mu sync.Mutex
	ch chan struct{}
}

func newWatch() *watch { return &watch{ch: make(chan struct{})} }

func (w *watch) poke() {
	w.mu.Lock()
	close(w.ch)
	w.ch = make(chan struct{})
	w.mu.Unlock()
}

// until returns once cond holds, re-checking it after each poke.
func (w *watch) until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		ch := w.ch
		w.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("gave up after %s waiting for %s", waitTimeout, what)
		}
	}
}

// fleet is a set of cleaners on one schema, one pool each, as separate
// application instances would run them.
type fleet struct {
	schema   string
	admin    *pgxpool.Pool
	cleaners []*pglimitclean.Cleaner
	w        *watch

	beforeBatch atomic.Pointer[func()] // if set, called as a batch starts
	stops       atomic.Int32           // Stop calls that have begun stopping

	lockKey atomic.Int64 // the advisory lock of the last cleaner added

	mu       sync.Mutex
	acquired []leaderEvent // every time an instance became leader
	started  map[int]time.Time
	spans    []batchSpan // every batch, as its instance's hooks saw it
}

// batchSpan is one DELETE batch from its start hook to its end hook.
type batchSpan struct {
	start, end time.Time
	err        error
}

type leaderEvent struct {
	instance int
	at       time.Time
}

// newFleet starts n cleaners on a fresh schema; edit adjusts their config.
func newFleet(t testing.TB, n int, edit func(*pglimitclean.Config)) *fleet {
	t.Helper()
	f := &fleet{schema: testdb.Schema(t), admin: testdb.Pool(t), w: newWatch()}
	for range n {
		f.add(t, edit)
	}
	return f
}

// add starts one more cleaner, with its own pool, stopped when the test
// ends.
func (f *fleet) add(t testing.TB, edit func(*pglimitclean.Config)) *pglimitclean.Cleaner {
	t.Helper()
	i := len(f.cleaners)
	cfg := &pglimitclean.Config{
		Schema:    f.schema,
		Interval:  20 * time.Millisecond,
		Retention: time.Minute,
		Logger:    slog.New(slog.NewTextHandler(t.Output(), nil)).With("instance", i),
	}
	if edit != nil {
		edit(cfg)
	}
	f.lockKey.Store(pglimitclean.LockKey(cfg.Schema, cfg.Tables...))
	pglimitclean.SetHooks(cfg, pglimitclean.Hooks{
		BatchStart: func(string) {
			f.mu.Lock()
			if f.started == nil {
				f.started = map[int]time.Time{}
			}
			f.started[i] = time.Now()
			f.mu.Unlock()
			if fn := f.beforeBatch.Load(); fn != nil {
				(*fn)()
			}
		},
		BatchEnd: func(_ string, _ int64, err error) {
			f.mu.Lock()
			f.spans = append(f.spans, batchSpan{f.started[i], time.Now(), err})
			f.mu.Unlock()
			f.w.poke()
		},
		Leader: func(leader bool) {
			if leader {
				f.mu.Lock()
				f.acquired = append(f.acquired, leaderEvent{i, time.Now()})
				f.mu.Unlock()
			}
			f.w.poke()
		},
		Stopping: func() {
			f.stops.Add(1)
			f.w.poke()
		},
	})
	c, err := pglimitclean.New(testdb.Pool(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("stop cleaner %d: %v", i, err)
		}
	})
	f.cleaners = append(f.cleaners, c)
	return c
}

// leaders returns the instances that report leadership.
func (f *fleet) leaders() []int {
	var out []int
	for i, c := range f.cleaners {
		if c.Stats().Leader {
			out = append(out, i)
		}
	}
	return out
}

// oneLeader waits until exactly one instance reports leadership and
// returns it.
func (f *fleet) oneLeader(t *testing.T) int {
	t.Helper()
	f.w.until(t, "exactly one leader", func() bool { return len(f.leaders()) == 1 })
	return f.leaders()[0]
}

// lockHolder returns the backend pid holding the advisory lock of the
// fleet's last cleaner, or 0, and how many sessions hold it.
func (f *fleet) lockHolder(t *testing.T) (pid int32, holders int) {
	t.Helper()
	rows, err := f.admin.Query(context.Background(), `
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND (classid::bigint << 32 | objid::bigint) = $1`, f.lockKey.Load())
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	if len(pids) == 0 {
		return 0, 0
	}
	return pids[0], len(pids)
}

func (f *fleet) table(name string) string { return pgx.Identifier{f.schema, name}.Sanitize() }

// seedKeys inserts n rows into an Upsert or NoWait table whose cooldowns
// end at now()+end, keyed prefix1..prefixN.
func (f *fleet) seedKeys(t testing.TB, table, prefix string, n int, end string) {
	t.Helper()
	_, err := f.admin.Exec(context.Background(), `INSERT INTO `+f.table(table)+` (namespace, key, expires_at)
SELECT 'ns', $1 || g, now() + $3::interval FROM generate_series(1, $2) g`, prefix, n, end)
	if err != nil {
		t.Fatal(err)
	}
}

// seedRanges inserts n admissions into the Range table, one key each,
// whose cooldowns end at now()+end. It inserts in short statements on
// parallel connections: the migrations of tests running meanwhile build
// indexes CONCURRENTLY, which waits for every older transaction.
func (f *fleet) seedRanges(t testing.TB, prefix string, n int, end string) {
	t.Helper()
	const chunk = 5_000
	var g errgroup.Group
	g.SetLimit(int(f.admin.Config().MaxConns))
	for from := 1; from <= n; from += chunk {
		g.Go(func() error {
			_, err := f.admin.Exec(context.Background(), `INSERT INTO `+f.table("pglimit_range")+` (namespace, key, during)
SELECT 'ns', $1 || g, tstzrange(now() + $2::interval - interval '1 hour', now() + $2::interval)
FROM generate_series($3::int, $4::int) g`, prefix, end, from, min(from+chunk-1, n))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// count returns how many rows of table match the condition.
func (f *fleet) count(t testing.TB, table, where string, args ...any) int {
	t.Helper()
	var n int
	if err := f.admin.QueryRow(context.Background(), "SELECT count(*) FROM "+f.table(table)+" WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *fleet) deleted() (total uint64, by []uint64) {
	for _, c := range f.cleaners {
		n := c.Stats().RowsDeleted
		by = append(by, n)
		total += n
	}
	return total, by
}

func TestCleanerOneLeaderDeletes(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 3, nil)
	leader := f.oneLeader(t)
	if pid, holders := f.lockHolder(t); pid == 0 || holders != 1 {
		t.Fatalf("advisory lock held by %d sessions, want 1", holders)
	}

	const rounds, perRound = 3, 50
	for r := range rounds {
		f.seedKeys(t, "pglimit_upsert", fmt.Sprintf("round%d-", r), perRound, "-1 hour")
		f.w.until(t, fmt.Sprintf("round %d deleted", r), func() bool {
			if l := f.leaders(); len(l) > 1 {
				t.Fatalf("instances %v all report leadership", l)
			}
			total, _ := f.deleted()
			return total == uint64((r+1)*perRound)
		})
	}

	if got := f.oneLeader(t); got != leader {
		t.Fatalf("leadership moved from %d to %d with no failure", leader, got)
	}
	for i, c := range f.cleaners {
		s := c.Stats()
		if i == leader {
			if s.RowsDeleted != rounds*perRound || s.Runs < rounds || s.LastSuccess.IsZero() {
				t.Errorf("leader %d: %+v, want %d rows deleted over at least %d runs", i, s, rounds*perRound, rounds)
			}
			continue
		}
		if s.RowsDeleted != 0 || s.Runs != 0 || s.Batches != 0 {
			t.Errorf("follower %d ran cleanup: %+v", i, s)
		}
	}
	if n := f.count(t, "pglimit_upsert", "true"); n != 0 {
		t.Errorf("%d rows left", n)
	}
}

// Two services share a schema but clean different tables: each table set
// elects its own leader, so neither set is left uncleaned.
func TestCleanerTableSetsLeadApart(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 0, nil)
	for _, table := range []string{"pglimit_upsert", "pglimit_nowait"} {
		f.add(t, func(c *pglimitclean.Config) { c.Tables = []string{table} })
	}
	f.seedKeys(t, "pglimit_upsert", "u", 50, "-1 hour")
	f.seedKeys(t, "pglimit_nowait", "n", 50, "-1 hour")
	f.w.until(t, "both tables cleaned", func() bool {
		return f.count(t, "pglimit_upsert", "true") == 0 && f.count(t, "pglimit_nowait", "true") == 0
	})
	if l := f.leaders(); len(l) != 2 {
		t.Errorf("instances %v lead, want both: each leads its own table set", l)
	}
}

func TestCleanerTakeover(t *testing.T) {
	t.Parallel()
	const interval = 20 * time.Millisecond
	f := newFleet(t, 3, func(c *pglimitclean.Config) {
		c.Interval = interval
		c.BatchSize = 100
	})
	f.oneLeader(t)
	oldPID, _ := f.lockHolder(t)

	// A backlog, so that batches run while the leader's connection dies.
	const backlog = 5000
	f.seedKeys(t, "pglimit_upsert", "old-", backlog, "-1 hour")
	f.w.until(t, "a first batch", func() bool { total, _ := f.deleted(); return total > 0 })

	f.mu.Lock()
	before := len(f.acquired)
	f.mu.Unlock()
	killed := time.Now()
	var ok bool
	if err := f.admin.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", oldPID).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %t, %v", oldPID, ok, err)
	}

	var took time.Duration
	f.w.until(t, "a new leader", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.acquired) == before {
			return false
		}
		took = f.acquired[before].at.Sub(killed)
		return true
	})
	// Documented bound: one election interval plus a round trip; the
	// margin absorbs a loaded machine.
	if bound := interval + 5*time.Second; took > bound {
		t.Errorf("takeover took %s, more than %s", took, bound)
	}
	t.Logf("takeover after pg_terminate_backend: %s (election interval %s)", took, interval)

	newPID, holders := f.lockHolder(t)
	if holders != 1 || newPID == oldPID {
		t.Fatalf("lock held by pid %d (%d sessions) after killing %d", newPID, holders, oldPID)
	}
	f.w.until(t, "the backlog deleted", func() bool { return f.count(t, "pglimit_upsert", "true") == 0 })
	f.oneLeader(t)

	// No two batches ran at once, except the one whose session was
	// terminated: the server ended it at the kill, and its instance may
	// learn of that after the new leader has started.
	f.mu.Lock()
	spans := slices.Clone(f.spans)
	f.mu.Unlock()
	for i, a := range spans {
		for _, b := range spans[i+1:] {
			if a.start.Before(b.end) && b.start.Before(a.end) {
				killedOne := (a.err != nil && b.start.After(killed)) || (b.err != nil && a.start.After(killed))
				if !killedOne {
					t.Errorf("two batches ran at once across instances: %+v and %+v", a, b)
				}
			}
		}
	}
	total, by := f.deleted()
	// A batch killed with its session rolled back; one killed between its
	// commit and its reply is deleted but not counted.
	if total > backlog {
		t.Errorf("instances report %v = %d rows deleted, more than the %d there were", by, total, backlog)
	}
	t.Logf("rows deleted by instance: %v", by)
}

func TestCleanerLargeBacklog(t *testing.T) {
	testdb.Slow(t)
	t.Parallel()
	f := newFleet(t, 0, nil)
	const expired, live, recent = 200_000, 1_000, 500
	f.seedRanges(t, "expired-", expired, "-1 hour")
	f.seedRanges(t, "live-", live, "1 hour")
	f.seedRanges(t, "recent-", recent, "-10 seconds") // ended, but within the retention
	f.seedKeys(t, "pglimit_upsert", "expired-", expired/10, "-1 hour")
	f.seedKeys(t, "pglimit_upsert", "live-", live, "1 hour")
	f.seedKeys(t, "pglimit_nowait", "recent-", recent, "-10 seconds")

	lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Strategy: pglimit.Range, Schema: f.schema, Namespace: "ns", Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// Allow on other keys keeps answering while batches run; its latency
	// is measured by BenchmarkAllowDuringCleanup.
	done := make(chan struct{})
	answered := make(chan int)
	go func() {
		n := 0
		defer func() { answered <- n }()
		for {
			select {
			case <-done:
				return
			default:
			}
			d, err := lim.Allow(context.Background(), fmt.Sprintf("other-%d", n))
			if err != nil || !d.Allowed {
				t.Errorf("Allow during cleanup: %+v, %v", d, err)
				return
			}
			n++
		}
	}()
	start := time.Now()
	cleaner := f.add(t, func(c *pglimitclean.Config) {
		c.Interval = 50 * time.Millisecond
		c.BatchSize = 5000
	})
	f.w.until(t, "all expired rows deleted", func() bool { return cleaner.Stats().RowsDeleted == expired+expired/10 })
	took := time.Since(start)
	close(done)
	allowed := <-answered

	if n := f.count(t, "pglimit_range", "upper(during) < now()"); n != recent {
		t.Errorf("%d ended Range rows left, want the %d within the retention", n, recent)
	}
	for _, tt := range []struct {
		table, prefix string
		want          int
	}{
		{"pglimit_range", "live-", live}, {"pglimit_range", "recent-", recent},
		{"pglimit_upsert", "live-", live}, {"pglimit_nowait", "recent-", recent},
	} {
		if n := f.count(t, tt.table, "key LIKE $1", tt.prefix+"%"); n != tt.want {
			t.Errorf("%s: %d %s rows left, want all %d", tt.table, n, tt.prefix, tt.want)
		}
	}
	if n := f.count(t, "pglimit_range", "key LIKE 'other-%'"); n != allowed {
		t.Errorf("%d rows of the %d admissions made during cleanup", n, allowed)
	}
	s := cleaner.Stats()
	t.Logf("deleted %d rows in %d batches within %s of Start (%.0f rows/s); %d Allow calls answered meanwhile",
		s.RowsDeleted, s.Batches, took.Round(time.Millisecond), float64(s.RowsDeleted)/took.Seconds(), allowed)
}

// Stop waits for a batch that is running, then stops before the next, and
// gives up leadership last: until the batch has ended, no other instance
// leads; once Stop has returned, another does.
func TestCleanerStopWaitsForBatch(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2, func(c *pglimitclean.Config) {
		c.Tables = []string{"pglimit_upsert"}
		c.BatchSize = 10
	})
	leader := f.oneLeader(t)
	c := f.cleaners[leader]
	pid, _ := f.lockHolder(t)
	f.seedKeys(t, "pglimit_upsert", "k", 50, "-1 hour")

	// Hold the first batch that starts after the seed, recording the stats
	// from before it.
	inBatch, release := make(chan pglimitclean.Stats), make(chan struct{})
	var once sync.Once
	hold := func() {
		once.Do(func() {
			inBatch <- c.Stats()
			<-release
		})
	}
	f.beforeBatch.Store(&hold)
	before := <-inBatch

	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(context.Background()) }()
	f.w.until(t, "Stop to begin", func() bool { return f.stops.Load() > 0 })
	if l := f.leaders(); len(l) != 1 || l[0] != leader {
		t.Errorf("while the stopping leader's batch runs, instances %v lead, want only %d", l, leader)
	}
	if holder, n := f.lockHolder(t); holder != pid || n != 1 {
		t.Errorf("while the stopping leader's batch runs, backend %d (of %d) holds the lock, want the leader's %d", holder, n, pid)
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	s := c.Stats()
	if s.Batches != before.Batches+1 || s.RowsDeleted != before.RowsDeleted+10 || s.Leader {
		t.Fatalf("before the held batch: %+v; after Stop: %+v; want that one batch of 10 rows finished, no other, and leadership released", before, s)
	}
	if next := f.oneLeader(t); next == leader {
		t.Fatalf("instance %d leads after its Stop", next)
	}
}

// Stop whose grace runs out cancels the running batch, returns, and leaves
// nothing running: no goroutine, and no server session holding the lock.
// Not parallel, so that goleak sees this test's goroutines only.
func TestCleanerStopCancelsBatch(t *testing.T) {
	ctx := context.Background()
	schema := testdb.Schema(t)
	admin := testdb.Pool(t)
	ignore := goleak.IgnoreCurrent()

	pool := testdb.Pool(t)
	inBatch := make(chan struct{})
	var once sync.Once
	cfg := &pglimitclean.Config{Schema: schema, Interval: 20 * time.Millisecond, Retention: time.Minute, BatchTimeout: time.Minute}
	pglimitclean.SetHooks(cfg, pglimitclean.Hooks{BatchStart: func(string) { once.Do(func() { close(inBatch) }) }})
	c, err := pglimitclean.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}

	// Hold a lock that the first DELETE waits for.
	blocker, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(ctx) }()
	if _, err := blocker.Exec(ctx, "LOCK TABLE "+pgx.Identifier{schema, "pglimit_upsert"}.Sanitize()+" IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}

	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-inBatch
	const grace = 200 * time.Millisecond
	stopCtx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	start := time.Now()
	err = c.Stop(stopCtx)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Stop with a blocked batch: %v, want it to wrap context.DeadlineExceeded", err)
	}
	if took > grace+2*time.Second {
		t.Errorf("Stop took %s with a grace of %s", took, grace)
	}
	t.Logf("Stop returned %s after its %s grace ran out", took-grace, grace)

	// The server aborts the abandoned DELETE and ends the session.
	var free bool
	deadline := time.Now().Add(waitTimeout)
	for !free && time.Now().Before(deadline) {
		err := admin.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
  AND (classid::bigint << 32 | objid::bigint) = $1)`, pglimitclean.LockKey(schema)).Scan(&free)
		if err != nil {
			t.Fatal(err)
		}
		if !free {
			time.Sleep(20 * time.Millisecond) // the server side has no hook to wait on
		}
	}
	if !free {
		t.Error("the stopped cleaner's session still holds the lock")
	}
	t.Logf("the server freed the lock %s after Stop returned", time.Since(start)-took)
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	goleak.VerifyNone(t, ignore)
}

// A leader whose connection stalls (a hung backend, a silent network)
// while the election pings on it must not hold Stop past its ctx: the run
// that waits for that connection gives up when Stop's grace runs out.
func TestCleanerStopWithinCtxWhenLeaderStalls(t *testing.T) {
	t.Parallel()
	schema := testdb.Schema(t)
	proxy, poolCfg := testdb.NewStallProxy(t)
	waiting, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	cfg := &pglimitclean.Config{
		Schema:    schema,
		Tables:    []string{"pglimit_upsert"},
		Interval:  50 * time.Millisecond,
		Retention: time.Minute,
		Logger:    slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
	pglimitclean.SetHooks(cfg, pglimitclean.Hooks{BatchWait: func(string) {
		once.Do(func() {
			close(waiting)
			<-release
		})
	}})
	stalling, err := pgxpool.NewWithConfig(context.Background(), poolCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stalling.Close)
	c, err := pglimitclean.New(stalling, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })

	// A run begins (so this instance leads); its first batch is held
	// before it asks for the connection. The connection stalls, and the
	// next election ping hangs on it.
	select {
	case <-waiting:
	case <-time.After(waitTimeout):
		t.Fatal("no cleanup batch started")
	}
	proxy.Stall()
	select {
	case <-proxy.Held():
	case <-time.After(waitTimeout):
		t.Fatal("the leader sent nothing on its stalled connection")
	}
	close(release) // the batch now wants the connection the ping holds

	const grace = 300 * time.Millisecond
	stopCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	start := time.Now()
	err = c.Stop(stopCtx)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Stop: %v, want it to wrap context.DeadlineExceeded", err)
	}
	if took > grace+500*time.Millisecond {
		t.Fatalf("Stop took %s with a grace of %s while the leader's connection stalled", took, grace)
	}
	t.Logf("Stop returned %s after its %s grace ran out", took-grace, grace)
}

func TestCleanerConfigErrors(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	for _, tt := range []struct {
		field string
		cfg   pglimitclean.Config
	}{
		{"Schema", pglimitclean.Config{Schema: "Public"}},
		{"Tables[1]", pglimitclean.Config{Tables: []string{"pglimit_upsert", "x; DROP TABLE y"}}},
		{"Tables[1]", pglimitclean.Config{Tables: []string{"pglimit_upsert", "pglimit_upsert"}}},
		{"Interval", pglimitclean.Config{Interval: -time.Second}},
		{"Retention", pglimitclean.Config{Retention: -time.Nanosecond}},
		{"BatchSize", pglimitclean.Config{BatchSize: -1}},
		{"BatchTimeout", pglimitclean.Config{BatchTimeout: -time.Second}},
	} {
		_, err := pglimitclean.New(pool, &tt.cfg)
		if !errors.Is(err, pglimit.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig naming %s", tt.cfg, err, tt.field)
		}
	}
	if _, err := pglimitclean.New(nil, nil); !errors.Is(err, pglimit.ErrInvalidConfig) {
		t.Errorf("New(nil pool) = %v, want ErrInvalidConfig", err)
	}
	c, err := pglimitclean.New(pool, nil)
	if err != nil {
		t.Fatalf("New with defaults: %v", err)
	}
	if err := c.Stop(context.Background()); err != nil {
		t.Errorf("Stop before Start: %v", err)
	}
}

// Start checks that the tables exist and have a column that ends cooldowns.
func TestCleanerStartChecksTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, pool := testdb.Schema(t), testdb.Pool(t)
	if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{schema, "other"}.Sanitize()+" (id int)"); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"missing", "other"} {
		c, err := pglimitclean.New(pool, &pglimitclean.Config{Schema: schema, Tables: []string{table}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); !errors.Is(err, pglimit.ErrInvalidConfig) || !strings.Contains(err.Error(), table) {
			t.Errorf("Start with table %s: %v, want ErrInvalidConfig naming it", table, err)
		}
	}
}

// BenchmarkAllowDuringCleanup measures Allow (Range strategy, a fresh key
// each time) on a Range table holding 200,000 expired admissions, with no
// cleaner ("idle") and while a cleaner with the default batch size deletes
// them ("cleanup"). Latency percentiles cover only the calls that started
// and ended while the cleaner was deleting (counted in calls-during-cleanup);
// cleanup-rows/s is the cleaner's throughput from Start to the last row.
//
//	go test ./pglimit -run '^$' -bench AllowDuringCleanup -benchtime 2000x -count 3
func BenchmarkAllowDuringCleanup(b *testing.B) {
	const expired, live = 200_000, 1_000
	for _, clean := range []bool{false, true} {
		name := map[bool]string{false: "idle", true: "cleanup"}[clean]
		b.Run(name, func(b *testing.B) {
			f := newFleet(b, 0, nil)
			f.seedRanges(b, "expired-", expired, "-1 hour")
			f.seedRanges(b, "live-", live, "1 hour")
			if _, err := f.admin.Exec(context.Background(), "VACUUM ANALYZE "+f.table("pglimit_range")); err != nil {
				b.Fatal(err)
			}
			lim, err := pglimit.New(testdb.Pool(b), &pglimit.Config{Strategy: pglimit.Range, Schema: f.schema, Namespace: "ns", Cooldown: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()

			cleaning := func() bool { return false }
			var cleaner *pglimitclean.Cleaner
			start := time.Now()
			if clean {
				cleaner = f.add(b, func(c *pglimitclean.Config) {
					c.Interval = 50 * time.Millisecond
					c.Logger = slog.New(slog.DiscardHandler)
				})
				f.w.until(b, "a first batch", func() bool { return cleaner.Stats().RowsDeleted > 0 })
				cleaning = func() bool { return cleaner.Stats().RowsDeleted < expired }
			}
			lat := make([]time.Duration, 0, 1<<16)
			i := 0
			for b.Loop() {
				during := cleaning()
				t0 := time.Now()
				d, err := lim.Allow(ctx, fmt.Sprintf("bench-%d", i))
				if took := time.Since(t0); !clean || during && cleaning() {
					lat = append(lat, took)
				}
				if err != nil || !d.Allowed {
					b.Fatalf("Allow: %+v, %v", d, err)
				}
				i++
			}
			b.StopTimer()
			if len(lat) > 0 {
				slices.Sort(lat)
				pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
				b.ReportMetric(pct(0.50), "p50-µs")
				b.ReportMetric(pct(0.99), "p99-µs")
				b.ReportMetric(pct(1), "max-µs")
			}
			if clean {
				b.ReportMetric(float64(len(lat)), "calls-during-cleanup")
				f.w.until(b, "all expired rows deleted", func() bool { return !cleaning() })
				b.ReportMetric(float64(expired)/time.Since(start).Seconds(), "cleanup-rows/s")
			}
		})
	}
}
