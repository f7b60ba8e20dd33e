package pglimitclean

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/internal/cleanup"
	"github.com/pglimit/cooldown/pglimit/internal/leadership"
	"github.com/pglimit/cooldown/pglimit/internal/lockid"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
	"github.com/pglimit/cooldown/pglimit/internal/service"
)

// Config configures a [Cleaner]. A nil or zero Config means defaults.
type Config struct {
	// Schema holds the tables to clean. A plain identifier. Defaults to
	// "public".
	Schema string

	// Tables lists the tables to clean, by plain name in Schema. Each must
	// have the shape the migrations create: an expires_at timestamptz column
	// (Upsert, NoWait, a [Semaphore]'s slots) or a during tstzrange column
	// (Range). Defaults to "pglimit_upsert", "pglimit_nowait",
	// "pglimit_range", "pglimit_slots" (with pglimit_slot_waiters,
	// which is cleaned with it), "pglimit_ids", the decision ids
	// ([pglimit.WithID]), whose expires_at is the end of the limiter's
	// IDRetention: an id is deleted Retention after it, and
	// "pglimit_quota_ids", pglimitquota's decision ids. A table with
	// no index on expires_at (the unlogged ones) is swept by ranges of
	// blocks: each batch reads BatchSize/16 blocks, each run the table once.
	Tables []string

	// Interval is the time between two cleanup runs. Instances also try for
	// leadership this often, but at least every 10s. Defaults to 1 minute.
	Interval time.Duration

	// Retention is how long after its limits ended a row is kept. A row whose
	// limits ended means the same as no row, so any value is safe; keeping rows
	// a while means the cleaner rarely touches a key that is still in use
	// (a returning Upsert or NoWait key is then an update, not a delete and
	// an insert, and NoWait, which refuses a key whose row is locked, seldom
	// meets a row the cleaner is deleting) and the Range table doubles as a
	// short admission log. Must not be negative; zero means the default, so
	// use a nanosecond to delete as soon as rows end. Defaults to 10
	// minutes.
	Retention time.Duration

	// BatchSize is the most rows one DELETE removes. A run repeats batches
	// until one deletes fewer. Must not be negative. Defaults to 1000.
	BatchSize int

	// BatchTimeout bounds each batch, on the server (statement_timeout) so
	// that a slow batch fails without costing the connection. Must not be
	// negative. Defaults to 5s.
	BatchTimeout time.Duration

	// Logger receives failures (Warn, Error), leadership changes (Info) and
	// a line per run (Debug). Defaults to [slog.Default].
	Logger *slog.Logger

	// Observer, when set, sees each run this instance makes as leader.
	// Defaults to nil.
	Observer Observer

	hooks *hooks // tests only; see export_test.go
}

// hooks lets tests wait for events instead of sleeping. Hooks run
// synchronously on the cleaner's goroutines and must not block for long.
type hooks struct {
	batchStart func(table string)                        // on the leader's connection, before the DELETE
	batchEnd   func(table string, rows int64, err error) // after it
	leader     func(leader bool)                         // leadership gained or lost
	stopping   func()                                    // Stop has begun: no new run starts
	batchWait  func(table string)                        // a batch is about to wait for the leader's connection
}

// The tables a Cleaner cleans by default, as the migrations create them:
// the Upsert, NoWait and Range limiters' (pglimit.Config.Table's
// defaults), pglimitsem's slots (00007) and the queue of their waiters
// (00010), cleaned with them, and the decision ids (00013) and
// pglimitquota's (00015).
const (
	defaultSchema    = "public"
	slotsTable       = "pglimit_slots"
	slotWaitersTable = "pglimit_slot_waiters"
)

var defaultTables = []string{"pglimit_upsert", "pglimit_nowait", "pglimit_range", slotsTable, "pglimit_ids", "pglimit_quota_ids"}

const (
	defaultCleanInterval = time.Minute
	defaultRetention     = 10 * time.Minute
	defaultBatchSize     = 1000
	defaultBatchTimeout  = 5 * time.Second
	maxElectionInterval  = 10 * time.Second
)

// Stats is what a [Cleaner] has done since it was created. The counters
// only grow, so a metrics collector can export them as counters.
type Stats struct {
	Runs         uint64        // cleanup runs this instance started as leader
	Batches      uint64        // DELETE batches that committed
	RowsDeleted  uint64        // rows those batches deleted
	Errors       uint64        // batches that failed; a failure ends its run
	LastSuccess  time.Time     // when the last run without error ended; zero if none has
	LastDuration time.Duration // how long the last finished run took
	Leader       bool          // whether this instance is the leader now
}

// Cleaner deletes limiter rows whose limits ended more than
// [Config.Retention] ago, every [Config.Interval], in batches. Run one in every instance of the application: they elect a
// leader through a PostgreSQL session advisory lock, one per schema and
// set of [Config.Tables], and only the leader deletes, on the very
// connection that holds the lock. Cleaners of the same schema with other
// table sets elect their own leader; two sets that share a table both
// clean it, which is safe (rows locked by the other are skipped) but not
// one at a time.
//
// If the leader's session ends (its process exits, its connection is closed
// or terminated, it stops), another instance takes over within one election
// interval E = min(Interval, 10s) plus a round trip; within 1s + E if the
// leader died during a batch. If the leader hangs or its host vanishes, the
// server ends its idle session after max(4E, 5s), and takeover follows
// within one more E. Needs PostgreSQL 14 or later.
//
// The cleaner takes one connection out of the pool for good, for the lock;
// it needs a real session (not PgBouncer transaction pooling).
type Cleaner struct {
	pool    *pgxpool.Pool
	cfg     Config
	elector *leadership.Elector

	// mu orders Start and Stop: Start sets sched under it once the loop
	// runs, and Stop reads it under it.
	mu    sync.Mutex
	sched gocron.Scheduler

	runner *cleanup.Runner // one cleanup of every table, and its counts

	// All the work runs on one goroutine, the service's loop: gocron keeps
	// time and asks the elector, and its job only offers the loop a tick,
	// never waiting for it. So runs never overlap, Stop has one goroutine
	// to wait for, and once Stop has begun no batch begins.
	svc  service.Service // Graceful: a running batch may finish
	tick chan struct{}   // gocron's job to the loop; dropped while a run is on
}

// New returns a cleaner for pool's database. It does no I/O; call
// [Cleaner.Start] to begin.
func New(pool *pgxpool.Pool, cfg *Config) (*Cleaner, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", pglimit.ErrInvalidConfig)
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c.Logger = c.Logger.With("schema", c.Schema)
	cl := &Cleaner{pool: pool, cfg: c, svc: service.Service{Graceful: true}, tick: make(chan struct{})}
	hooks := c.hooks
	cl.runner = &cleanup.Runner{
		Retention: c.Retention, BatchSize: c.BatchSize, BatchTimeout: c.BatchTimeout,
		Logger: c.Logger, Stopping: cl.svc.Stopping(),
	}
	if obs := c.Observer; obs != nil {
		cl.runner.Ended = func(ctx context.Context, rows int64, took time.Duration, err error) {
			obs.ObserveCleanup(ctx, Observation{Schema: c.Schema, Rows: rows, Took: took, Err: err})
		}
	}
	if hooks != nil {
		cl.runner.Hooks = &cleanup.Hooks{BatchWait: hooks.batchWait, BatchStart: hooks.batchStart, BatchEnd: hooks.batchEnd}
	}
	cl.elector = leadership.New(leadership.Config{
		Acquire:  cl.acquire,
		Key:      lockid.Cleanup(c.Schema, c.Tables),
		Interval: min(c.Interval, maxElectionInterval),
		Logger:   c.Logger,
		OnChange: func(leader bool) {
			if hooks != nil && hooks.leader != nil {
				hooks.leader(leader)
			}
		},
	})
	cl.runner.Elector = cl.elector
	return cl, nil
}

func (c *Config) withDefaults() (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	out.Schema = cmp.Or(out.Schema, defaultSchema)
	if err := pglimit.ValidateIdentifier(out.Schema); err != nil {
		return out, fmt.Errorf("%w: Schema: %w", pglimit.ErrInvalidConfig, err)
	}
	if len(out.Tables) == 0 {
		out.Tables = defaultTables
	}
	out.Tables = slices.Clone(out.Tables)
	for i, t := range out.Tables {
		if err := pglimit.ValidateIdentifier(t); err != nil {
			return out, fmt.Errorf("%w: Tables[%d]: %w", pglimit.ErrInvalidConfig, i, err)
		}
		if slices.Index(out.Tables, t) != i {
			return out, fmt.Errorf("%w: Tables[%d]: %q is listed twice", pglimit.ErrInvalidConfig, i, t)
		}
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Interval", &out.Interval, defaultCleanInterval},
		{"Retention", &out.Retention, defaultRetention},
		{"BatchTimeout", &out.BatchTimeout, defaultBatchTimeout},
	} {
		if *d.v < 0 {
			return out, fmt.Errorf("%w: %s must not be negative, got %s", pglimit.ErrInvalidConfig, d.name, *d.v)
		}
		*d.v = cmp.Or(*d.v, d.def)
	}
	if out.BatchSize < 0 {
		return out, fmt.Errorf("%w: BatchSize must not be negative, got %d", pglimit.ErrInvalidConfig, out.BatchSize)
	}
	out.BatchSize = cmp.Or(out.BatchSize, defaultBatchSize)
	out.Logger = cmp.Or(out.Logger, slog.Default())
	return out, nil
}

// Start checks the tables, then starts the election and the schedule. The
// first run comes one Interval after Start. ctx bounds the checks only; the
// cleaner runs until [Cleaner.Stop]. A cleaner starts at most once.
func (c *Cleaner) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sched != nil {
		return fmt.Errorf("pglimitclean: %w", service.ErrStarted)
	}
	tables := make([]cleanup.Table, 0, len(c.cfg.Tables)+1)
	for _, name := range c.cfg.Tables {
		names := []string{name}
		if name == slotsTable { // and the queue of the slots' waiters
			names = append(names, slotWaitersTable)
		}
		for _, name := range names {
			t, err := cleanup.Describe(ctx, c.pool, c.cfg.Schema, name)
			switch {
			case errors.Is(err, cleanup.ErrNotLimiterTable):
				return fmt.Errorf("%w: Tables: %w", pglimit.ErrInvalidConfig, err)
			case err != nil:
				return fmt.Errorf("pglimitclean: %w", err)
			}
			tables = append(tables, t)
		}
	}
	sched, err := gocron.NewScheduler(gocron.WithDistributedElector(c.elector))
	if err != nil {
		return fmt.Errorf("pglimitclean: %w", err)
	}
	_, err = sched.NewJob(gocron.DurationJob(c.cfg.Interval), gocron.NewTask(c.offerTick),
		gocron.WithName("pglimit cleanup "+c.cfg.Schema))
	if err != nil {
		_ = sched.Shutdown()
		return fmt.Errorf("pglimitclean: %w", err)
	}
	if err := c.svc.Start(func(ctx context.Context) { c.loop(ctx, tables) }); err != nil {
		_ = sched.Shutdown()
		return fmt.Errorf("pglimitclean: %w", err)
	}
	c.sched = sched
	c.elector.Start()
	sched.Start()
	return nil
}

// Stop stops scheduling, waits for a running batch to finish, and gives up
// leadership, so another instance takes over at its next election. If ctx
// ends first, the running batch is cancelled (it rolls back) and Stop
// returns an error wrapping ctx's. Either way nothing of the cleaner is left
// running when Stop returns. Stop on a cleaner not started, or already
// stopped, does nothing.
func (c *Cleaner) Stop(ctx context.Context) error {
	c.mu.Lock()
	sched := c.sched
	c.mu.Unlock()
	var err error
	started, werr := c.svc.Stop(ctx, func() {
		// From here on no batch begins.
		if h := c.cfg.hooks; h != nil && h.stopping != nil {
			h.stopping()
		}
		// The job never waits for the loop, so this returns at once.
		if serr := sched.Shutdown(); serr != nil {
			err = fmt.Errorf("pglimitclean: stop scheduler: %w", serr)
		}
	})
	if !started {
		return nil
	}
	if werr != nil {
		err = errors.Join(err, fmt.Errorf("pglimitclean: stop: running batch cancelled: %w", werr))
	}
	// Last, so that no other instance leads while this one still deletes.
	c.elector.Stop(ctx)
	return err
}

// Stats returns what the cleaner has done so far.
func (c *Cleaner) Stats() Stats {
	r := c.runner
	s := Stats{
		Runs:         r.Runs.Load(),
		Batches:      r.Batches.Load(),
		RowsDeleted:  r.RowsDeleted.Load(),
		Errors:       r.Errors.Load(),
		LastDuration: time.Duration(r.LastDuration.Load()),
		Leader:       c.elector.Leader(),
	}
	if ns := r.LastSuccess.Load(); ns != 0 {
		s.LastSuccess = time.Unix(0, ns)
	}
	return s
}

// acquire takes a connection out of the pool for the elector, so that it
// is dialled with the pool's settings and hooks, and sets the per-batch
// timeout on it.
func (c *Cleaner) acquire(ctx context.Context) (*pgx.Conn, error) {
	pc, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn := pc.Hijack()
	ms := (c.cfg.BatchTimeout + time.Millisecond - 1) / time.Millisecond // round up: 0 would disable it
	if _, err := conn.Exec(ctx, queries.Static("cleanup.statement_timeout"), fmt.Sprintf("%dms", ms)); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	return conn, nil
}

// offerTick is the scheduled job: gocron calls it only while the elector
// says this instance leads. A tick that comes while a run is on is
// dropped, as gocron's singleton mode would.
func (c *Cleaner) offerTick() {
	select {
	case c.tick <- struct{}{}:
	default:
	}
}

// loop runs a cleanup of tables for each tick until Stop; ctx ends only
// when Stop's grace runs out.
func (c *Cleaner) loop(ctx context.Context, tables []cleanup.Table) {
	stopping := c.svc.Stopping()
	for {
		select {
		case <-stopping:
			return
		case <-c.tick:
			c.runner.Run(ctx, tables)
		}
	}
}

// Observer sees each run of a [Cleaner] on the instance that leads
// ([Config.Observer]).
type Observer interface {
	// ObserveCleanup is called on the cleaner's goroutine once a run has
	// ended.
	ObserveCleanup(ctx context.Context, o Observation)
}

// Observation is one cleanup run, as an [Observer] sees it.
type Observation struct {
	Schema string
	Rows   int64 // deleted by the run's batches that committed
	Took   time.Duration
	Err    error // nil for a run that cleaned every table
}
