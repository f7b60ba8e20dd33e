package pglimitriver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
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
	return startClients(t, pools, schema, func(c *river.Config) { c.Middleware = []rivertype.Middleware{mw} }, work)
}

// startClients is startWorkers with the middleware installed by install.
func startClients(t *testing.T, pools []*pgxpool.Pool, schema string, install func(*river.Config), work func(context.Context, *river.Job[exportArgs]) error) []*river.Client[pgx.Tx] {
	t.Helper()
	var clients []*river.Client[pgx.Tx]
	for _, pool := range pools {
		workers := river.NewWorkers()
		river.AddWorker(workers, &exportWorker{work: work})
		cfg := &river.Config{
			Schema:            schema,
			Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 8}},
			Workers:           workers,
			FetchCooldown:     5 * time.Millisecond,
			FetchPollInterval: 20 * time.Millisecond,
			RetryPolicy:       soon{},
			TestOnly:          true,
			Logger:            slog.New(slog.DiscardHandler),
		}
		install(cfg)
		c, err := river.NewClient(riverpgxv5.New(pool), cfg)
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
	id      int64
	state   string
	attempt int
	snoozes int
}

// waitJobs waits, at most a minute, until no job of schema is left to
// work, and returns every job.
func waitJobs(t *testing.T, pool *pgxpool.Pool, schema string, n int) []jobRow {
	t.Helper()
	q := fmt.Sprintf(`SELECT id, state::text, attempt, coalesce((metadata->>'snoozes')::int, 0)
		FROM %s ORDER BY id`, pgx.Identifier{schema, "river_job"}.Sanitize())
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		rows, _ := pool.Query(t.Context(), q)
		jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (jobRow, error) {
			var j jobRow
			err := r.Scan(&j.id, &j.state, &j.attempt, &j.snoozes)
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

// 40 exports of one customer, worked by two workers of 8 under a limit
// of 10 a second (burst 2), the middleware installed as a River plugin:
// every job completes on its first attempt (a snooze uses up none), and
// the starts hold no more in any second than the limit admits plus what
// River's lateness in bringing reserved jobs back adds. Reserving, each
// job refused at first is snoozed once, until its unit is due, and starts
// no earlier; with NoReserve no job reserves, and every start is decided.
func TestRateAcrossWorkers(t *testing.T) {
	t.Parallel()
	for _, noReserve := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoReserve=%t", noReserve), func(t *testing.T) {
			t.Parallel()
			rateAcrossWorkers(t, noReserve)
		})
	}
}

func rateAcrossWorkers(t *testing.T, noReserve bool) {
	pool := testdb.Pool(t)
	schema := riverSchema(t, pool)
	const rate, burst = 10, 2
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "jobs",
		Limits: []pglimit.Limit{{Name: "exports", Rate: rate, Period: time.Second, Burst: burst}}})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Limiter: lim, Key: customerKey, NoReserve: noReserve})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var starts []time.Time
	reserved := 0
	late := time.Duration(0) // the latest start after a unit's due time
	install := func(c *river.Config) { c.Plugins = []rivertype.Plugin{mw} }
	clients := startClients(t, []*pgxpool.Pool{pool, testdb.Pool(t)}, schema, install, func(_ context.Context, job *river.Job[exportArgs]) error {
		now := time.Now()
		var meta struct {
			R *struct {
				Due time.Time `json:"due"`
			} `json:"pglimitriver_reservation"`
		}
		if err := json.Unmarshal(job.Metadata, &meta); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		starts = append(starts, now)
		if meta.R != nil {
			reserved++
			if now.Before(meta.R.Due) {
				t.Errorf("job %d started %s before its unit was due", job.ID, meta.R.Due.Sub(now))
			}
			late = max(late, now.Sub(meta.R.Due))
		}
		return nil
	})
	const n = 40
	insert(t, clients[0], "acme", n)
	jobs := waitJobs(t, pool, schema, n)
	snoozes := 0
	for _, j := range jobs {
		if j.state != "completed" || j.attempt != 1 {
			t.Errorf("job %+v: want completed on its first attempt", j)
		}
		snoozes += j.snoozes
	}
	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(starts, time.Time.Compare)
	most := 0
	for i, s := range starts {
		in := 0
		for _, u := range starts[i:] {
			if u.Sub(s) < time.Second {
				in++
			}
		}
		most = max(most, in)
	}
	// GCRA admits at most Burst + Rate units in any second; a job that
	// comes back late by up to late starts in a later second than its
	// unit's, so a second holds the units of at most 1 s + late.
	if bound := burst + int(math.Ceil(rate*(1+late.Seconds()))); most > bound {
		t.Errorf("%d jobs started within one second, past the limit's %d (its jobs came back at most %s late)", most, bound, late.Round(time.Millisecond))
	}
	if snoozes == 0 {
		t.Errorf("no job was snoozed: the limit never refused")
	}
	span := starts[len(starts)-1].Sub(starts[0])
	t.Logf("%d jobs in %s (%.1f/s, limit %d/s burst %d), at most %d in a second, %d snoozes, %d jobs on a reservation, at most %s late",
		n, span.Round(time.Millisecond), float64(n-1)/span.Seconds(), rate, burst, most, snoozes, reserved, late.Round(time.Millisecond))
	if noReserve {
		if reserved != 0 {
			t.Errorf("%d jobs ran on a reservation under NoReserve", reserved)
		}
		return
	}
	// Each job is snoozed once, until its reserved unit is due; the 2
	// the burst admits at once are not snoozed at all.
	if snoozes > 2*n {
		t.Errorf("%d snoozes for %d jobs: more than 2 a job", snoozes, n)
	}
	// The limit admits the 38 past the burst in 3.8 s; 2 s more is the
	// last job's way back from its snooze on a loaded machine.
	if limit := time.Duration(n-burst)*time.Second/rate + 2*time.Second; span > limit {
		t.Errorf("the %d jobs took %s, past %s: the limit's pace is not kept", n, span.Round(time.Millisecond), limit)
	}
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

// 8 exports of one customer that take 100 ms each, under a limit of 20 a
// second (burst 1) and 1 slot: the jobs reserve their units faster than
// the slot frees, so reserved jobs come due while the slot is held. Never
// more than 1 runs at once, none starts before a unit it reserved is due,
// every job completes on its first attempt, and no reservation outlives
// the attempt that came back to it: a job snoozed for the slot decides
// again rather than run later on units due long before.
func TestSlotsWithRate(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := riverSchema(t, pool)
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "jobs",
		Limits: []pglimit.Limit{{Name: "exports", Rate: 20, Period: time.Second, Burst: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	sem, err := pglimitsem.New(pool, &pglimitsem.Config{Schema: schema, Namespace: "exports", Slots: 1, TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Limiter: lim, Semaphore: sem, Key: customerKey, SlotSnooze: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var running, peak, reserved atomic.Int32
	clients := startWorkers(t, []*pgxpool.Pool{pool}, schema, mw, func(ctx context.Context, job *river.Job[exportArgs]) error {
		var meta struct {
			R *struct {
				Due time.Time `json:"due"`
			} `json:"pglimitriver_reservation"`
		}
		if err := json.Unmarshal(job.Metadata, &meta); err != nil {
			return err
		}
		if meta.R != nil {
			reserved.Add(1)
			if now := time.Now(); now.Before(meta.R.Due) {
				t.Errorf("job %d started %s before its unit was due", job.ID, meta.R.Due.Sub(now))
			}
		}
		now := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); p = peak.Load() {
		}
		time.Sleep(100 * time.Millisecond)
		return nil
	})
	const n = 8
	insert(t, clients[0], "acme", n)
	jobs := waitJobs(t, pool, schema, n)
	snoozes := 0
	for _, j := range jobs {
		if j.state != "completed" || j.attempt != 1 {
			t.Errorf("job %+v: want completed on its first attempt", j)
		}
		snoozes += j.snoozes
	}
	if p := peak.Load(); p != 1 {
		t.Errorf("at most %d exports of the customer ran at once, want 1", p)
	}
	var left int
	q := fmt.Sprintf(`SELECT count(*) FROM %s WHERE metadata->'pglimitriver_reservation' <> 'null'`, pgx.Identifier{schema, "river_job"}.Sanitize())
	if err := pool.QueryRow(t.Context(), q).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d completed jobs still hold a reservation", left)
	}
	t.Logf("%d jobs, %d snoozes, %d started on a reservation", n, snoozes, reserved.Load())
}

// While the limiter's database cannot be reached, a limiter with a
// Fallback decides the jobs in process, as it decides AllowN (Reserve has
// no fallback): 3 exports under a fallback burst of 5 all complete on
// their first attempt, where an error would have cost each an attempt.
func TestFallbackWhileDown(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := riverSchema(t, pool)
	down, err := pgxpool.New(t.Context(), "postgres://app@127.0.0.1:1/app?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(down.Close)
	lim, err := pglimit.New(down, &pglimit.Config{Schema: schema, Namespace: "jobs",
		Limits: []pglimit.Limit{{Name: "exports", Rate: 10, Period: time.Second, Burst: 2}},
		Fallback: &pglimit.Fallback{
			Limits: []pglimit.Limit{{Name: "exports-local", Rate: 10, Period: time.Second, Burst: 5}},
			Logger: slog.New(slog.DiscardHandler),
		}})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Limiter: lim, Key: customerKey})
	if err != nil {
		t.Fatal(err)
	}
	clients := startWorkers(t, []*pgxpool.Pool{pool}, schema, mw, func(context.Context, *river.Job[exportArgs]) error { return nil })
	insert(t, clients[0], "acme", 3)
	for _, j := range waitJobs(t, pool, schema, 3) {
		if j.state != "completed" || j.attempt != 1 {
			t.Errorf("job %+v: want completed on its first attempt, decided in process", j)
		}
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
	st, err := pglimit.Inspect(t.Context(), lim, "export/acme")
	if err != nil || st.Limits[0].Remaining != 0 {
		t.Fatalf("the quota after 3 exports that each failed once: %+v, %v; want 3 used", st, err)
	}
}

// A job's key or cost that cannot be used cancels the job (a cost past
// the burst too, though it would fit a reservation), and a Middleware
// needs a Limiter or a Semaphore and a MaxReserve it can use.
func TestBadInput(t *testing.T) {
	t.Parallel()
	if _, err := pglimitriver.NewMiddleware(&pglimitriver.Config{}); !errors.Is(err, pglimitriver.ErrInvalidConfig) {
		t.Errorf("NewMiddleware without a Limiter or a Semaphore: %v, want ErrInvalidConfig", err)
	}
	pool := testdb.Pool(t)
	schema := riverSchema(t, pool)
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Limits: []pglimit.Limit{{Rate: 10, Period: time.Second, Burst: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{-time.Second, time.Microsecond, time.Hour + time.Second} {
		if _, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Limiter: lim, MaxReserve: d}); !errors.Is(err, pglimitriver.ErrInvalidConfig) {
			t.Errorf("NewMiddleware with MaxReserve %s: %v, want ErrInvalidConfig", d, err)
		}
	}
	mw, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Limiter: lim,
		Key: func(job *rivertype.JobRow) (string, error) {
			var args exportArgs
			_ = json.Unmarshal(job.EncodedArgs, &args)
			return args.Customer, nil // "" is not a key
		},
		Cost: func(job *rivertype.JobRow) (int, error) {
			var args exportArgs
			_ = json.Unmarshal(job.EncodedArgs, &args)
			if args.Customer == "big" {
				return 3, nil // past the burst of 2, within 5 s of reservation
			}
			return 1, nil
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
	insert(t, clients[0], "big", 1)
	for _, j := range waitJobs(t, pool, schema, 3) {
		if j.state != "cancelled" {
			t.Errorf("a job with an empty key or a cost past the burst: %+v, want cancelled", j)
		}
	}
	if w := worked.Load(); w != 0 {
		t.Errorf("%d jobs with an empty key or a cost past the burst were worked", w)
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
