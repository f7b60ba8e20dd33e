// Package pglimithealth is a throttle that listens to the database: the
// rate of a [pglimit.Limiter] key that follows signals read from
// PostgreSQL itself, so that background work (River jobs, backfills, bulk
// outbound calls) slows down when the database it shares with the
// application is in trouble, and speeds up again when it recovers.
//
// # How it works
//
// Every instance runs a [Throttle] of the same [Config.Name]. They elect
// one leader per cluster and name, with the session advisory lock the
// Cleaner's election uses. Each [Config.Period] the leader runs one
// statement on its own session that samples every signal of
// [Config.Signals], applies the rule below to the rate stored in the
// database, and writes the new rate as the throttle key's own limit in
// pglimit_overrides (no expiry: [pglimit.SetKeyLimits]' row) and the rate
// with its reason in pglimit_health. The throttled work uses an ordinary
// limiter with [pglimit.Config.Overrides] on, on [Config.Key]: every
// instance's next decision reads the rate, and pglimitriver's middleware
// and pglimithttp's Transport use it unchanged. [Status] (and `pglimit
// health`) shows the rate and why it is there.
//
// # The rule
//
// Of the signals sampled, the worst is the one with the largest
// value/threshold. With r the stored rate (Ceiling before the first
// sample), F the Floor, C the Ceiling, d the Decrease and i the Increase:
//
//	worst value > its threshold:  r' = max(F, floor(r × d))     (multiplicative decrease)
//	otherwise:                    r' = min(C, r + i)            (additive increase)
//
// and r' is kept within [F, C] (a configuration changed since r was
// written). So, over its threshold, the rate reaches the floor from the
// ceiling within ceil(log(C/F) / log(1/d)) samples; healthy, it climbs
// back within ceil((C − F) / i) samples.
//
// # Bounds
//
//   - The rate is always in [Floor, Ceiling] once sampled; it is never
//     unlimited. Before the first sample the limiter's own configured
//     rate applies: configure it at the floor.
//   - One statement per Period per cluster and name, on the leader's
//     session. The election is apart, as the Cleaner's: each follower
//     asks for the lock, and the leader pings, every min(Period, 10s).
//   - If the leader dies the rate stays where it was (the overrides row
//     never lapses) until another leader samples: within the election
//     bounds of the Cleaner (package leadership), E = min(Period, 10s)
//     plus a round trip when the session ends, max(4E, 5s) + E when the
//     leader's host vanishes.
//   - Each sample is bounded by a statement_timeout of max(Period, 1s) on
//     the leader's session, and given up 1s after that if the server
//     goes silent. With [StandbyReplayDelay], the leader first reads
//     every standby at once, for at most max(Period, 1s) more: one query
//     per standby per sample, by the leader alone.
//   - A standby that cannot be read in that time counts as infinitely
//     behind (+Inf, over any threshold), as freno and the Vitess
//     throttler count an unreachable replica: from the first sample that
//     begins after it stopped answering.
//
// The signals but one read the primary's views: [ReplicationLag] is that
// of the standbys connected now (a standby that is disconnected is not
// seen). [StandbyReplayDelay] reads each standby of [Config.Standbys]
// itself, so a standby disconnected or unreachable is seen as behind.
// The throttle needs PostgreSQL 14 or later, a real session (not
// PgBouncer transaction pooling) for its election, and a role with
// pg_monitor (or pg_read_all_stats): one without never leads
// ([ErrNoStats]). A Transport over a limiter with per-key limits cannot
// store a 429's pause for every instance ([pglimit.Pause] refuses it):
// the pause holds back the instance that got it. docs/health.md has a
// worked example.
package pglimithealth

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/internal/leadership"
	"github.com/pglimit/cooldown/pglimit/internal/lockid"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
	"github.com/pglimit/cooldown/pglimit/internal/service"
)

// Kind names a signal read from PostgreSQL.
type Kind string

// The signals a throttle can read, each with the unit of its value and
// threshold.
const (
	// ReplicationLag is the largest replay_lag of the standbys connected
	// to the primary (pg_stat_replication), in seconds; 0 with none.
	ReplicationLag Kind = "replication_lag"
	// ReplicationLagBytes is the most WAL a connected standby has still
	// to replay, in bytes (pg_current_wal_lsn() against replay_lsn).
	ReplicationLagBytes Kind = "replication_lag_bytes"
	// ActiveSessions is the client sessions running a statement
	// (pg_stat_activity, state 'active'), the sampler's own excepted, as
	// a fraction of max_connections: 0.8 is 80%.
	ActiveSessions Kind = "active_sessions"
	// LockWaiters is the number of sessions waiting for a lock
	// (pg_stat_activity, wait_event_type 'Lock').
	LockWaiters Kind = "lock_waiters"
	// WALRate is the WAL the primary wrote, in bytes a second, since the
	// throttle's previous sample (by any leader: the position is stored
	// with the state); 0 at the first sample.
	WALRate Kind = "wal_rate"
	// StandbyReplayDelay is the largest replay delay of the standbys of
	// [Config.Standbys], read on each standby itself, in seconds: 0 for a
	// standby that streams from its primary and has replayed all the WAL
	// it received; otherwise the age of the last transaction it replayed
	// (now() - pg_last_xact_replay_timestamp(), on the standby's clock).
	// A standby that cannot be read within max(Period, 1s), or that is
	// behind with no transaction replayed since it started, counts as
	// infinitely behind: +Inf, over any threshold.
	StandbyReplayDelay Kind = "standby_replay_delay"
)

// Kinds returns every signal kind.
func Kinds() []Kind {
	return []Kind{ReplicationLag, ReplicationLagBytes, ActiveSessions, LockWaiters, WALRate, StandbyReplayDelay}
}

// signalSQL names each kind's statement, a scalar subquery.
var signalSQL = map[Kind]string{
	ReplicationLag:      "health.signal.replication_lag",
	ReplicationLagBytes: "health.signal.replication_lag_bytes",
	ActiveSessions:      "health.signal.active_sessions",
	LockWaiters:         "health.signal.lock_waiters",
	WALRate:             "health.signal.wal_rate",
	StandbyReplayDelay:  "health.signal.standby_replay_delay",
}

// Signal is one signal and the threshold past which the rate decreases.
type Signal struct {
	Kind Kind
	// Threshold is in the signal's unit (see [Kind]); it must be positive
	// and finite. A value above it is over.
	Threshold float64
}

// Config configures a [Throttle]. Every instance's Throttle of one Name
// must have the same Config.
type Config struct {
	// Name identifies the throttle: its leader election and its row in
	// pglimit_health. Same rules as a pglimit key.
	Name string

	// Limiter is the throttled limiter's configuration, with Overrides
	// set (and so a Namespace). Its Schema holds pglimit_health too.
	Limiter *pglimit.Config

	// Key is the limiter key whose rate the throttle sets: the one the
	// throttled work asks for.
	Key string

	// Limit names the limiter's limit whose rate the throttle sets.
	// Defaults to the only one when the limiter has one. Rates are in its
	// Period.
	Limit string

	// Signals are what the throttle reads, at least one, each kind once.
	Signals []Signal

	// Standbys are pools to the standbys that the [StandbyReplayDelay]
	// signal reads: required with that signal, refused without it, none
	// nil. Each sample the leader alone runs one query on each, all at
	// once; other instances send them nothing (and open no connection,
	// while a pool's MinConns is 0). A pool whose server is not in
	// recovery fails the sample with [ErrNotStandby].
	Standbys []*pgxpool.Pool

	// Floor and Ceiling bound the rate: 1 <= Floor <= Ceiling <= 2^30,
	// and no more than the limit's Period has microseconds.
	Floor, Ceiling int64

	// Increase is the additive step per healthy sample, at least 1.
	Increase int64

	// Decrease is the multiplicative factor per sample over a threshold,
	// in (0, 1).
	Decrease float64

	// Period is the time between two samples, from 10ms to 1 hour. The
	// leader election also runs every min(Period, 10s).
	Period time.Duration

	// ID names this instance in pglimit_health's leader column. Defaults
	// to the host name and process id.
	ID string

	// Logger receives failures and leadership changes. Defaults to
	// [slog.Default].
	Logger *slog.Logger

	// OnSample, when set, is called with each sample this instance takes
	// as leader, from the throttle's goroutine; it must not block.
	OnSample func(State)
}

// ErrInvalidConfig is pglimit's: a Config the throttle refuses, before
// any I/O.
var ErrInvalidConfig = pglimit.ErrInvalidConfig

// State is a throttle's rate and why it is there, as its leader last
// wrote it.
type State struct {
	Name string
	// Rate is the throttle key's rate now, in the limit's Period.
	Rate int64
	// Over is whether the last sample's worst signal was over its
	// threshold (so the rate decreased, or stayed at the floor).
	Over bool
	// Signal, Value and Threshold are the last sample's worst signal:
	// the largest Value/Threshold.
	Signal    Kind
	Value     float64
	Threshold float64
	// Samples counts the samples taken, by every leader.
	Samples int64
	// SampledAt is when the last sample was taken, Since when the rate
	// last changed, both on the database clock.
	SampledAt, Since time.Time
	// Leader is the ID of the instance that took the last sample.
	Leader string
}

// String says the rate and why: "rate 10 since 12:00:01 because
// replication_lag 12 > 5".
func (s State) String() string {
	cmp := "<="
	if s.Over {
		cmp = ">"
	}
	return fmt.Sprintf("%s: rate %d since %s because %s %s %s %s (sampled %s by %s, %d samples)",
		s.Name, s.Rate, s.Since.UTC().Format(time.RFC3339), s.Signal, fmtFloat(s.Value), cmp, fmtFloat(s.Threshold),
		s.SampledAt.UTC().Format(time.RFC3339Nano), s.Leader, s.Samples)
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', 6, 64) }

// Throttle keeps one limiter key's rate in step with the database's
// health. Create it with [New], run it with [Throttle.Start], end it with
// [Throttle.Stop].
type Throttle struct {
	pool    *pgxpool.Pool
	cfg     Config
	ns      string
	stmt    string
	standby string   // the query each standby answers
	unread  []string // each standby's last read error, for the log; the loop's own
	elector *leadership.Elector
	lockKey int64           // the election's advisory lock, per schema and Name
	svc     service.Service // the sampling loop
	mu      sync.Mutex      // orders Start and Stop
	started bool
}

const (
	minPeriod           = 10 * time.Millisecond
	maxPeriod           = time.Hour
	maxElectionInterval = 10 * time.Second
	maxRate             = 1 << 30              // pglimit_overrides' bound
	maxSpan             = 366 * 24 * time.Hour // pglimit's longest period
	minSampleTimeout    = time.Second
	silentGrace         = time.Second // past statement_timeout, for a silent server
)

// New returns a throttle over pool's database. It does no I/O; a Config
// it refuses is [ErrInvalidConfig].
func New(pool *pgxpool.Pool, cfg *Config) (*Throttle, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pglimithealth: pool is nil", ErrInvalidConfig)
	}
	c, ns, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	schema := cmp.Or(c.Limiter.Schema, "public")
	health := pgx.Identifier{schema, "pglimit_health"}.Sanitize()
	rows := make([]string, len(c.Signals))
	for i, s := range c.Signals {
		rows[i] = fmt.Sprintf("('%s', %s, %s::float8)", s.Kind, queries.Text(signalSQL[s.Kind], queries.Args{"health": health}),
			strconv.FormatFloat(s.Threshold, 'g', -1, 64))
	}
	t := &Throttle{pool: pool, cfg: c, ns: ns, standby: queries.Static("health.standby"), unread: make([]string, len(c.Standbys))}
	t.stmt = queries.Text("health.sample", queries.Args{
		"signals":   strings.Join(rows, ", "),
		"health":    health,
		"overrides": pgx.Identifier{schema, "pglimit_overrides"}.Sanitize(),
	})
	t.lockKey = lockid.Of[int64]("pglimit/health/" + schema + "/" + c.Name)
	t.elector = leadership.New(leadership.Config{
		Acquire:  t.acquire,
		Key:      t.lockKey,
		Role:     "health throttle",
		Interval: min(c.Period, maxElectionInterval),
		Logger:   c.Logger.With("throttle", c.Name),
	})
	return t, nil
}

// validate returns cfg with defaults, and the limiter's namespace.
func (cfg *Config) validate() (Config, string, error) {
	bad := func(format string, args ...any) (Config, string, error) {
		return Config{}, "", fmt.Errorf("%w: pglimithealth: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if cfg == nil {
		return bad("Config is nil")
	}
	c := *cfg
	if err := pglimit.ValidateKey(c.Name); err != nil {
		return bad("Name: %v", err)
	}
	if err := pglimit.ValidateKey(c.Key); err != nil {
		return bad("Key: %v", err)
	}
	if c.Limiter == nil || !c.Limiter.Overrides {
		return bad("Limiter must be a configuration with Overrides set")
	}
	// A copy, which the caller cannot change under the throttle.
	lc := *c.Limiter
	lc.Limits = slices.Clone(lc.Limits)
	c.Limiter = &lc
	// pglimit's own checks of the limiter, without I/O, and without
	// what would attach the check's limiter to anything.
	check := lc
	check.Invalidator, check.Observer, check.Fallback = nil, nil, nil
	if _, err := pglimit.New(noDB{}, &check); err != nil {
		return Config{}, "", fmt.Errorf("pglimithealth: Limiter: %w", err)
	}
	lim := c.Limiter.Limits
	if c.Limit == "" && len(lim) == 1 {
		c.Limit = lim[0].Name
	}
	i := slices.IndexFunc(lim, func(l pglimit.Limit) bool { return l.Name == c.Limit })
	if c.Limit == "" || i < 0 {
		return bad("Limit %q names none of the limiter's limits", c.Limit)
	}
	l := lim[i]
	if c.Period < minPeriod || c.Period > maxPeriod {
		return bad("Period %s, not in [%s, %s]", c.Period, minPeriod, maxPeriod)
	}
	if c.Floor < 1 || c.Floor > c.Ceiling || c.Ceiling > maxRate {
		return bad("Floor %d and Ceiling %d: want 1 <= Floor <= Ceiling <= %d", c.Floor, c.Ceiling, maxRate)
	}
	// A key's rate may not exceed its period's microseconds, and a GCRA
	// burst must be replenished within 366 days at the floor: what
	// pglimit refuses in an overrides row.
	p := l.Period.Microseconds()
	if c.Ceiling > p {
		return bad("Ceiling %d exceeds limit %q's period in microseconds (%d)", c.Ceiling, l.Name, p)
	}
	if l.Algorithm == pglimit.GCRA {
		if t := (p + c.Floor - 1) / c.Floor; int64(l.Burst) > maxSpan.Microseconds()/t {
			return bad("Floor %d: limit %q's burst %d would take more than 366 days to replenish", c.Floor, l.Name, l.Burst)
		}
	}
	if c.Increase < 1 {
		return bad("Increase %d, want at least 1", c.Increase)
	}
	if !(c.Decrease > 0 && c.Decrease < 1) {
		return bad("Decrease %v, not in (0, 1)", c.Decrease)
	}
	if len(c.Signals) == 0 {
		return bad("no Signals")
	}
	c.Signals = slices.Clone(c.Signals)
	for i, s := range c.Signals {
		if !slices.Contains(Kinds(), s.Kind) {
			return bad("Signals[%d]: unknown kind %q", i, s.Kind)
		}
		if !(s.Threshold > 0) || math.IsInf(s.Threshold, 0) {
			return bad("Signals[%d]: threshold %v, want positive and finite", i, s.Threshold)
		}
		if slices.IndexFunc(c.Signals, func(o Signal) bool { return o.Kind == s.Kind }) != i {
			return bad("Signals[%d]: %s is listed twice", i, s.Kind)
		}
	}
	reads := slices.ContainsFunc(c.Signals, func(s Signal) bool { return s.Kind == StandbyReplayDelay })
	switch {
	case reads && len(c.Standbys) == 0:
		return bad("signal %s needs Standbys", StandbyReplayDelay)
	case !reads && len(c.Standbys) > 0:
		return bad("%d Standbys, but no %s signal reads them", len(c.Standbys), StandbyReplayDelay)
	}
	if i := slices.Index(c.Standbys, nil); i >= 0 {
		return bad("Standbys[%d] is nil", i)
	}
	c.Standbys = slices.Clone(c.Standbys)
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s/%d", cmp.Or(host, "unknown"), os.Getpid())
	}
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c, c.Limiter.Namespace, nil
}

// noDB lets New check a limiter configuration; New does no I/O.
type noDB struct{ pglimit.DB }

// Start starts the election and the sampling loop, without I/O of its
// own. The leader samples every Period, so the first sample comes within
// one Period of this instance's election. A throttle starts at most once.
func (t *Throttle) Start() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.svc.Start(t.loop); err != nil {
		return fmt.Errorf("pglimithealth: %w", err)
	}
	t.started = true
	t.elector.Start()
	return nil
}

// Stop ends sampling and gives up leadership, so that another instance
// takes over at its next election. The rate stays what it was. A sample
// running is cancelled. Stop on a throttle not started does nothing.
func (t *Throttle) Stop(ctx context.Context) error {
	t.mu.Lock()
	started := t.started
	t.mu.Unlock()
	if !started {
		return nil
	}
	_, err := t.svc.Stop(ctx, nil)
	t.elector.Stop(ctx)
	if err != nil {
		return fmt.Errorf("pglimithealth: stop: %w", err)
	}
	return nil
}

// Leader reports whether this instance samples now.
func (t *Throttle) Leader() bool { return t.elector.Leader() }

func (t *Throttle) loop(ctx context.Context) {
	ticker := time.NewTicker(t.cfg.Period)
	defer ticker.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if !t.elector.Leader() {
			continue
		}
		s, err := t.sample(ctx)
		switch {
		case errors.Is(err, leadership.ErrNotLeader) || ctx.Err() != nil:
		case err != nil:
			if err.Error() != lastErr {
				t.cfg.Logger.Warn("pglimithealth: sample failed", "throttle", t.cfg.Name, "err", err)
			}
			lastErr = err.Error()
		default:
			lastErr = ""
			if t.cfg.OnSample != nil {
				t.cfg.OnSample(s)
			}
		}
	}
}

// sample takes one sample on the leader's session and writes the rate:
// first the standbys' replay delay, where a signal reads it, then one
// statement.
func (t *Throttle) sample(ctx context.Context) (State, error) {
	var s State
	c := t.cfg
	args := []any{c.Name, c.Floor, c.Ceiling, c.Increase, c.Decrease, t.ns, c.Key, c.Limit, c.ID}
	if len(c.Standbys) > 0 {
		delay, err := t.standbyDelay(ctx)
		if err != nil {
			return s, err
		}
		args = append(args, delay)
	}
	// The server's statement_timeout bounds a slow statement; this, a
	// server or network gone silent.
	ctx, cancel := context.WithTimeout(ctx, t.sampleTimeout()+silentGrace)
	defer cancel()
	err := t.elector.Do(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		return scanState(conn.QueryRow(ctx, t.stmt, args...), &s)
	})
	return s, err
}

// ErrNotStandby is why a sample fails when a pool of [Config.Standbys]
// reaches a server that is not in recovery: a primary, or a standby since
// promoted. The sample writes nothing, so the rate holds where it was,
// and the leader logs it.
var ErrNotStandby = errors.New("pglimithealth: a pool of Config.Standbys reaches a server that is not a standby (not in recovery)")

// standbyDelay reads every standby's replay delay at once, each within
// max(Period, 1s), and returns the largest: +Inf for a standby that cannot
// be read in that time or whose delay is unknown. A standby that is not
// one ([ErrNotStandby]), or whose role cannot read pg_stat_wal_receiver
// ([ErrNoStats]), fails the sample.
func (t *Throttle) standbyDelay(ctx context.Context) (float64, error) {
	readCtx, cancel := context.WithTimeout(ctx, t.sampleTimeout())
	defer cancel()
	delays := make([]float64, len(t.cfg.Standbys))
	errs := make([]error, len(t.cfg.Standbys))
	var wg sync.WaitGroup
	for i, pool := range t.cfg.Standbys {
		wg.Go(func() { delays[i], errs[i] = t.readStandby(readCtx, pool) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	where := func(i int) string {
		cc := t.cfg.Standbys[i].Config().ConnConfig
		return fmt.Sprintf("Standbys[%d] (%s:%d)", i, cc.Host, cc.Port)
	}
	worst := 0.0
	for i, err := range errs {
		switch {
		case errors.Is(err, ErrNotStandby) || errors.Is(err, ErrNoStats):
			return 0, fmt.Errorf("%s: %w", where(i), err)
		case err != nil:
			if err.Error() != t.unread[i] {
				t.cfg.Logger.Warn("pglimithealth: a standby cannot be read; it counts as infinitely behind",
					"throttle", t.cfg.Name, "standby", where(i), "err", err)
			}
			t.unread[i] = err.Error()
		case t.unread[i] != "":
			t.cfg.Logger.Info("pglimithealth: a standby can be read again", "throttle", t.cfg.Name, "standby", where(i))
			t.unread[i] = ""
		}
		worst = max(worst, delays[i])
	}
	return worst, nil
}

// readStandby reads one standby's replay delay: +Inf, with the error,
// where it cannot.
func (t *Throttle) readStandby(ctx context.Context, pool *pgxpool.Pool) (float64, error) {
	var inRecovery, stats bool
	var delay *float64
	if err := pool.QueryRow(ctx, t.standby).Scan(&inRecovery, &stats, &delay); err != nil {
		return math.Inf(1), err
	}
	switch {
	case !inRecovery:
		return 0, ErrNotStandby
	case !stats:
		return 0, ErrNoStats
	case delay == nil: // behind, and no transaction replayed since it started
		return math.Inf(1), nil
	}
	return max(0, *delay), nil // a clock behind the primary's reads below 0
}

func scanState(row pgx.Row, s *State) error {
	var kind string
	if err := row.Scan(&s.Name, &s.Rate, &s.Over, &kind, &s.Value, &s.Threshold, &s.Samples, &s.SampledAt, &s.Since, &s.Leader); err != nil {
		return err
	}
	s.Signal = Kind(kind)
	return nil
}

// ErrNoStats is why an instance whose role lacks pg_read_all_stats never
// leads: its signals would read other roles' sessions and the standbys'
// lag as nothing. Its election logs it, once. A standby pool whose role
// lacks it fails each sample with it.
var ErrNoStats = errors.New("pglimithealth: the role cannot read every session's statistics: GRANT pg_monitor (or pg_read_all_stats) to it")

// acquire takes a connection out of the pool for the election, bounding
// each sample with a statement_timeout of max(Period, 1s), and refuses
// one whose role cannot see every session (ErrNoStats).
func (t *Throttle) acquire(ctx context.Context) (*pgx.Conn, error) {
	pc, err := t.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn := pc.Hijack()
	ms := t.sampleTimeout().Milliseconds()
	var timeout string
	var stats bool
	if err := conn.QueryRow(ctx, queries.Static("health.session"), fmt.Sprintf("%dms", ms)).Scan(&timeout, &stats); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	if !stats {
		_ = conn.Close(ctx)
		return nil, ErrNoStats
	}
	return conn, nil
}

// Querier runs a query, as *pgxpool.Pool, *pgx.Conn and pgx.Tx do.
type Querier interface {
	// Query runs sql with args and returns its rows, as pgx's Query does.
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// sampleTimeout is the statement_timeout of the leader's session.
func (t *Throttle) sampleTimeout() time.Duration { return max(t.cfg.Period, minSampleTimeout) }

// Status returns the state of the throttles of schema ("" for "public"):
// the one named name, or all of them for "". One statement; ctx bounds
// it. A database it cannot reach is [pglimit.ErrUnavailable].
func Status(ctx context.Context, db Querier, schema, name string) ([]State, error) {
	schema = cmp.Or(schema, "public")
	if err := pglimit.ValidateIdentifier(schema); err != nil {
		return nil, fmt.Errorf("%w: pglimithealth: schema: %v", ErrInvalidConfig, err)
	}
	var arg any
	if name != "" {
		arg = name
	}
	sql := queries.Text("health.state", queries.Args{"health": pgx.Identifier{schema, "pglimit_health"}.Sanitize()})
	r, err := db.Query(ctx, sql, arg)
	if err != nil {
		return nil, statusErr(ctx, err)
	}
	defer r.Close()
	var out []State
	for r.Next() {
		var s State
		if err := scanState(r, &s); err != nil {
			return nil, fmt.Errorf("pglimithealth: status: %w", err)
		}
		out = append(out, s)
	}
	if err := r.Err(); err != nil {
		return nil, statusErr(ctx, err)
	}
	return out, nil
}

// statusErr types Status's failures as pglimit's calls do: a database
// that cannot be reached is [pglimit.ErrUnavailable], the server's
// statement_timeout [pglimit.ErrTimeout]; ctx's end wraps ctx's error.
func statusErr(ctx context.Context, err error) error {
	switch {
	case ctx.Err() == nil && pgtx.Unavailable(err):
		return fmt.Errorf("%w (pglimithealth: status): %w", pglimit.ErrUnavailable, err)
	case ctx.Err() == nil && pgtx.ServerTimeout(err):
		return fmt.Errorf("%w (pglimithealth: status, by the server's statement_timeout): %w", pglimit.ErrTimeout, err)
	}
	return fmt.Errorf("pglimithealth: status: %w", err)
}
