package pglimitriver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
	"github.com/pglimit/cooldown/pglimitriver"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// exportArgs is a customer's export job.
type exportArgs struct {
	Customer string `json:"customer"`
	Seq      int    `json:"seq"`
}

func (exportArgs) Kind() string { return "export" }

type exportWorker struct {
	river.WorkerDefaults[exportArgs]
	work func(ctx context.Context, job *river.Job[exportArgs]) error
}

func (w *exportWorker) Work(ctx context.Context, job *river.Job[exportArgs]) error {
	return w.work(ctx, job)
}

// customerKey is a job's key: its customer's exports.
func customerKey(job *rivertype.JobRow) (string, error) {
	var args exportArgs
	if err := json.Unmarshal(job.EncodedArgs, &args); err != nil {
		return "", err
	}
	return "export/" + args.Customer, nil
}

// soon retries a failed job 10 ms after its attempt.
type soon struct{}

func (soon) NextRetry(job *rivertype.JobRow) time.Time { return time.Now().Add(10 * time.Millisecond) }

// riverSchema is a fresh schema of the test server with River's tables and
// pglimit's.
func riverSchema(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	schema := testdb.Schema(t)
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrator.Migrate(t.Context(), rivermigrate.DirectionUp, nil); err != nil {
		t.Fatal(err)
	}
	return schema
}

// startWorkers starts a River client on each pool, working exports with
// work behind mw, stopped when the test ends: two workers of one queue.
func startWorkers(t *testing.T, pools []*pgxpool.Pool, schema string, mw *pglimitriver.Middleware, work func(context.Context, *river.Job[exportArgs]) error) []*river.Client[pgx.Tx] {
	t.Helper()
	var clients []*river.Client[pgx.Tx]
	for _, pool := range pools {
		workers := river.NewWorkers()
		river.AddWorker(workers, &exportWorker{work: work})
		c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
			Schema:            schema,
			Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 8}},
			Workers:           workers,
			Middleware:        []rivertype.Middleware{mw},
			FetchCooldown:     5 * time.Millisecond,
			FetchPollInterval: 20 * time.Millisecond,
			RetryPolicy:       soon{},
			TestOnly:          true,
			Logger:            slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = c.Stop(ctx)
		})
		clients = append(clients, c)
	}
	return clients
}

// insert inserts n exports of customer.
func insert(t *testing.T, c *river.Client[pgx.Tx], customer string, n int) {
	t.Helper()
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: exportArgs{Customer: customer, Seq: i}}
	}
	if _, err := c.InsertMany(t.Context(), params); err != nil {
		t.Fatal(err)
	}
}

// jobRow is what the audit reads of a job.
type jobRow struct {
	state     string
	attempt   int
	attempted time.Time
	snoozes   int
}

// waitJobs waits, at most a minute, until no job of schema is left to
// work, and returns every job.
func waitJobs(t *testing.T, pool *pgxpool.Pool, schema string, n int) []jobRow {
	t.Helper()
	q := fmt.Sprintf(`SELECT state::text, attempt, attempted_at, coalesce((metadata->>'snoozes')::int, 0)
		FROM %s ORDER BY attempted_at`, pgx.Identifier{schema, "river_job"}.Sanitize())
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		rows, _ := pool.Query(t.Context(), q)
		jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (jobRow, error) {
			var j jobRow
			var at *time.Time
			err := r.Scan(&j.state, &j.attempt, &at, &j.snoozes)
			if at != nil {
				j.attempted = *at
			}
			return j, err
		})
		if err != nil {
			t.Fatal(err)
		}
		done := len(jobs) == n && !slices.ContainsFunc(jobs, func(j jobRow) bool {
			return j.state == "available" || j.state == "running" || j.state == "scheduled" || j.state == "retryable"
		})
		if done {
			return jobs
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs still to work after a minute: %+v", jobs)
		}
	}
}

// 40 exports of one customer, worked by two workers under a limit of 10 a
// second (burst 2): every job completes on its first attempt (the
// refusals snoozed them, using up none), and the jobs' attempted_at never
// hold more than the limit admits in any second.
func TestRateAcrossWorkers(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := riverSchema(t, pool)
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "jobs",
		Limits: []pglimit.Limit{{Name: "exports", Rate: 10, Period: time.Second, Burst: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Limiter: lim, Key: customerKey})
	if err != nil {
		t.Fatal(err)
	}
	clients := startWorkers(t, []*pgxpool.Pool{pool, testdb.Pool(t)}, schema, mw, func(context.Context, *river.Job[exportArgs]) error { return nil })
	const n = 40
	insert(t, clients[0], "acme", n)
	jobs := waitJobs(t, pool, schema, n)
	snoozes, most := 0, 0
	for i, j := range jobs {
		if j.state != "completed" || j.attempt != 1 {
			t.Errorf("job %+v: want completed on its first attempt", j)
		}
		snoozes += j.snoozes
		in := 0
		for _, k := range jobs[i:] {
			if k.attempted.Sub(j.attempted) < time.Second {
				in++
			}
		}
		most = max(most, in)
	}
	// GCRA admits at most Burst + Rate in any second.
	if most > 12 {
		t.Errorf("%d jobs attempted within one second, past the limit's 12", most)
	}
	if snoozes == 0 {
		t.Errorf("no job was snoozed: the limit never refused")
	}
	span := jobs[len(jobs)-1].attempted.Sub(jobs[0].attempted)
	t.Logf("%d jobs in %s (%.1f/s, limit 10/s burst 2), at most %d in a second, %d snoozes", n, span.Round(time.Millisecond), float64(n-1)/span.Seconds(), most, snoozes)
}

// 12 exports of one customer that take 150 ms each, worked by two workers
// of 8 each, with 2 slots per customer: never more than 2 run at once,
// and every job completes on its first attempt.
func TestSlotsAcrossWorkers(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := riverSchema(t, pool)
	sem, err := pglimitsem.New(pool, &pglimitsem.Config{Schema: schema, Namespace: "exports", Slots: 2, TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Semaphore: sem, Key: customerKey})
	if err != nil {
		t.Fatal(err)
	}
	var running, peak atomic.Int32
	clients := startWorkers(t, []*pgxpool.Pool{pool, testdb.Pool(t)}, schema, mw, func(ctx context.Context, job *river.Job[exportArgs]) error {
		now := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); p = peak.Load() {
		}
		time.Sleep(150 * time.Millisecond)
		return nil
	})
	const n = 12
	insert(t, clients[0], "acme", n)
	jobs := waitJobs(t, pool, schema, n)
	for _, j := range jobs {
		if j.state != "completed" || j.attempt != 1 {
			t.Errorf("job %+v: want completed on its first attempt", j)
		}
	}
	if p := peak.Load(); p != 2 {
		t.Errorf("at most %d exports of the customer ran at once, want 2", p)
	}
	if held := heldSlots(t, pool, schema); held != 0 {
		t.Errorf("%d slots held after every job ended", held)
	}
}

// heldSlots counts the live slots of schema.
func heldSlots(t *testing.T, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	q := fmt.Sprintf("SELECT count(*) FROM %s WHERE expires_at > now()", pgx.Identifier{schema, "pglimit_slots"}.Sanitize())
	if err := pool.QueryRow(t.Context(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// With RefundOnError, a job whose attempt failed gives its unit back: 3
// exports under a quota of 3 an hour, each failing once, all complete,
// and the quota counts 3. Without it the failed attempts would spend the
// quota and leave the jobs snoozed for the hour.
func TestRefundOnError(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := riverSchema(t, pool)
	cfg := pglimit.Config{Schema: schema, Namespace: "quota",
		Limits: []pglimit.Limit{{Name: "hourly", Rate: 3, Period: time.Hour, Algorithm: pglimit.FixedWindow}}}
	lim, err := pglimit.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Limiter: lim, Key: customerKey, RefundOnError: true})
	if err != nil {
		t.Fatal(err)
	}
	clients := startWorkers(t, []*pgxpool.Pool{pool}, schema, mw, func(_ context.Context, job *river.Job[exportArgs]) error {
		if job.Attempt == 1 {
			return fmt.Errorf("export %d: the first attempt fails", job.Args.Seq)
		}
		return nil
	})
	insert(t, clients[0], "acme", 3)
	for _, j := range waitJobs(t, pool, schema, 3) {
		if j.state != "completed" || j.attempt != 2 {
			t.Errorf("job %+v: want completed on its second attempt", j)
		}
	}
	st, err := pglimit.Inspect(t.Context(), pool, &cfg, "export/acme")
	if err != nil || st.Limits[0].Remaining != 0 {
		t.Fatalf("the quota after 3 exports that each failed once: %+v, %v; want 3 used", st, err)
	}
}

// A job's key or cost that cannot be used cancels the job, and a
// Middleware needs a Limiter or a Semaphore.
func TestBadInput(t *testing.T) {
	t.Parallel()
	if _, err := pglimitriver.NewMiddleware(&pglimitriver.Config{}); err == nil {
		t.Error("NewMiddleware without a Limiter or a Semaphore: no error")
	}
	pool := testdb.Pool(t)
	schema := riverSchema(t, pool)
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Limits: []pglimit.Limit{{Rate: 10, Period: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Limiter: lim,
		Key: func(job *rivertype.JobRow) (string, error) {
			var args exportArgs
			_ = json.Unmarshal(job.EncodedArgs, &args)
			return args.Customer, nil // "" is not a key
		}})
	if err != nil {
		t.Fatal(err)
	}
	var worked atomic.Int32
	clients := startWorkers(t, []*pgxpool.Pool{pool}, schema, mw, func(context.Context, *river.Job[exportArgs]) error {
		worked.Add(1)
		return nil
	})
	insert(t, clients[0], "", 2)
	for _, j := range waitJobs(t, pool, schema, 2) {
		if j.state != "cancelled" {
			t.Errorf("a job with an empty key: %+v, want cancelled", j)
		}
	}
	if w := worked.Load(); w != 0 {
		t.Errorf("%d jobs with an empty key were worked", w)
	}
}

// severable is a database handle that a test can cut off, as a worker
// that died loses its connections: every statement fails after cut.
type severable struct {
	pglimit.DB
	cut atomic.Bool
}

var errSevered = errors.New("severed: the worker died")

func (s *severable) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if s.cut.Load() {
		return pgconn.CommandTag{}, errSevered
	}
	return s.DB.Exec(ctx, sql, args...)
}

func (s *severable) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if s.cut.Load() {
		return severedRow{}
	}
	return s.DB.QueryRow(ctx, sql, args...)
}

type severedRow struct{}

func (severedRow) Scan(...any) error { return errSevered }

// A worker that dies while its job holds the customer's one slot (its
// semaphore's database cut off: no more extends, no release) gives the
// slot back when its lease ends: the other worker's job of the customer
// is snoozed until then, and runs after.
func TestKilledWorkerSlotReturns(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := riverSchema(t, pool)
	const ttl = 2 * time.Second
	dying := &severable{DB: testdb.Pool(t)}
	middleware := func(db pglimit.DB) *pglimitriver.Middleware {
		sem, err := pglimitsem.New(db, &pglimitsem.Config{Schema: schema, Namespace: "exports", Slots: 1, TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		mw, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Semaphore: sem, Key: customerKey, SlotSnooze: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return mw
	}
	started := make(chan time.Time, 1)
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	first := startWorkers(t, []*pgxpool.Pool{pool}, schema, middleware(dying), func(ctx context.Context, job *river.Job[exportArgs]) error {
		started <- time.Now()
		dying.cut.Store(true) // the worker dies with the slot held
		select {
		case <-hang:
		case <-ctx.Done():
		}
		return nil
	})
	insert(t, first[0], "acme", 1)
	took := <-started
	ran := make(chan time.Time, 1)
	second := startWorkers(t, []*pgxpool.Pool{testdb.Pool(t)}, schema, middleware(testdb.Pool(t)), func(context.Context, *river.Job[exportArgs]) error {
		ran <- time.Now()
		return nil
	})
	insert(t, second[0], "acme", 1)
	select {
	case at := <-ran:
		if after := at.Sub(took); after < ttl {
			t.Fatalf("the second job ran %s after the dead worker took the slot, before its %s lease ended", after, ttl)
		} else {
			t.Logf("the second job ran %s after the dead worker took the slot (lease %s)", after.Round(time.Millisecond), ttl)
		}
	case <-time.After(ttl + 20*time.Second):
		t.Fatal("the dead worker's slot never came back")
	}
}
