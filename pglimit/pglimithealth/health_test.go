package pglimithealth_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/internal/pgserver"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithealth"
)

// The throttle of the scenario tests: from 1000 a second down to 10 in
// two samples over the threshold (1000 × 0.1 × 0.1), and back up in two
// healthy ones (10 + 500 + 500, capped).
const (
	floor, ceiling = 10, 1000
	period         = 200 * time.Millisecond
	// patience bounds every wait for something the throttle or the
	// server will do: generous, for a loaded machine.
	patience = 60 * time.Second
)

// limiterConfig is the throttled limiter: its own rate is the floor, what
// applies before the first sample.
func limiterConfig(schema string) *pglimit.Config {
	return &pglimit.Config{
		Schema: schema, Namespace: "bulk", Overrides: true,
		Limits: []pglimit.Limit{{Name: "jobs", Rate: floor, Period: time.Second, Burst: 1}},
	}
}

func throttleConfig(schema, id string, sig pglimithealth.Signal, samples chan<- pglimithealth.State) *pglimithealth.Config {
	return &pglimithealth.Config{
		Name: "bulk", Limiter: limiterConfig(schema), Key: "backfill",
		Signals: []pglimithealth.Signal{sig},
		Floor:   floor, Ceiling: ceiling, Increase: 500, Decrease: 0.1,
		Period: period, ID: id,
		OnSample: func(s pglimithealth.State) {
			select {
			case samples <- s:
			default:
			}
		},
	}
}

func start(t *testing.T, pool *pgxpool.Pool, cfg *pglimithealth.Config) *pglimithealth.Throttle {
	t.Helper()
	th, err := pglimithealth.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := th.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = th.Stop(context.Background()) })
	return th
}

// status is the throttle's state as every instance reads it.
func status(t *testing.T, pool *pgxpool.Pool, schema string) pglimithealth.State {
	t.Helper()
	st, err := pglimithealth.Status(t.Context(), pool, schema, "bulk")
	if err != nil || len(st) != 1 {
		t.Fatalf("Status: %v, %v", st, err)
	}
	return st[0]
}

// keyRate is the rate of the throttle key's own limit, which it must hold
// for good (no expiry).
func keyRate(t *testing.T, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	own, err := pglimit.ListKeyLimits(t.Context(), testdb.Limiter(t, pool, limiterConfig(schema)), "", 10)
	if err != nil || len(own) != 1 || own[0].Key != "backfill" || len(own[0].Limits) != 1 {
		t.Fatalf("ListKeyLimits: %+v, %v", own, err)
	}
	if !own[0].Expires.IsZero() {
		t.Fatalf("the throttle key's limit lapses at %s; it must not", own[0].Expires)
	}
	return own[0].Limits[0].Rate
}

// nextSample waits for a sample that satisfies ok, from any instance.
func nextSample(t *testing.T, samples <-chan pglimithealth.State, what string, ok func(pglimithealth.State) bool) pglimithealth.State {
	t.Helper()
	timeout := time.After(patience)
	for {
		select {
		case s := <-samples:
			if ok(s) {
				return s
			}
		case <-timeout:
			t.Fatalf("no sample %s within %s", what, patience)
		}
	}
}

// drain empties samples, returning the last one (zero if none).
func drain(samples <-chan pglimithealth.State) (last pglimithealth.State) {
	for {
		select {
		case last = <-samples:
		default:
			return last
		}
	}
}

// retryAfter is how long the throttled limiter makes a second request on
// the key wait right after a first: 1/rate.
func retryAfter(t *testing.T, pool *pgxpool.Pool, schema string) (ra, took time.Duration) {
	t.Helper()
	lim, err := pglimit.New(pool, limiterConfig(schema))
	if err != nil {
		t.Fatal(err)
	}
	if err := lim.Reset(t.Context(), "backfill"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if _, err := lim.Allow(t.Context(), "backfill"); err != nil {
		t.Fatal(err)
	}
	d, err := lim.Allow(t.Context(), "backfill")
	if err != nil || d.Allowed {
		t.Fatalf("a second request at once: %+v, %v; want refused (burst 1)", d, err)
	}
	return d.RetryAfter, time.Since(began)
}

// pressure puts the database in trouble for one signal and takes it away.
type pressure struct{ on, off func() }

// scenario runs the throttle of signal sig on the server at url through
// trouble and recovery, a takeover and a leaderless spell:
//
//  1. two instances, healthy: the rate is the ceiling;
//  2. trouble: the rate reaches the floor at the second sample over the
//     threshold (within two periods of the signal passing it), and the
//     limiter enforces it;
//  3. recovery: the rate climbs back to the ceiling;
//  4. trouble again, then the leader's session is killed: the next
//     leader carries on from the floor; sampling was never done twice a
//     period;
//  5. every instance stopped, trouble gone: the rate holds at the floor
//     until a new instance samples.
//
// standbys are the throttles' Config.Standbys.
func scenario(t *testing.T, url string, sig pglimithealth.Signal, p pressure, standbys ...*pgxpool.Pool) {
	ctx := t.Context()
	schema := testdb.SchemaOn(t, url, nil)
	pool := testdb.PoolOn(t, url)
	samples := make(chan pglimithealth.State, 1000)
	config := func(id string) *pglimithealth.Config {
		cfg := throttleConfig(schema, id, sig, samples)
		cfg.Standbys = standbys
		return cfg
	}

	began := time.Now()
	a := start(t, pool, config("a"))
	a2 := start(t, pool, config("a2"))

	// 1. Healthy: the first sample sets the ceiling.
	first := nextSample(t, samples, "at the ceiling", func(s pglimithealth.State) bool { return s.Rate == ceiling })
	if first.Over || first.Signal != sig.Kind || first.Threshold != sig.Threshold {
		t.Fatalf("first sample %v: want healthy, of %s", first, sig.Kind)
	}
	if got := keyRate(t, pool, schema); got != ceiling {
		t.Fatalf("the key's limit is %d, want the ceiling %d", got, ceiling)
	}

	// 2. Trouble.
	p.on()
	over := nextSample(t, samples, "over the threshold", func(s pglimithealth.State) bool { return s.Over })
	low := over
	if low.Rate != floor {
		low = nextSample(t, samples, "at the floor", func(s pglimithealth.State) bool { return s.Rate == floor })
	}
	t.Logf("over: %v; floor: %v", over, low)
	// The signal passed the threshold after the sample before over: the
	// floor came within two periods of it, at the second sample.
	if over.Rate != ceiling/10 || low.Samples > over.Samples+1 {
		t.Fatalf("first sample over the threshold %v, floor reached at %v: want %d then %d at the next sample", over, low, ceiling/10, floor)
	}
	if gap := low.SampledAt.Sub(over.SampledAt); gap > 10*period {
		t.Errorf("the two samples to the floor %s apart, over ten periods", gap)
	}
	if st := status(t, pool, schema); st.Rate != floor || !st.Over || st.Signal != sig.Kind || st.Value <= st.Threshold {
		t.Errorf("Status at the floor: %v", st)
	}
	if got := keyRate(t, pool, schema); got != floor {
		t.Fatalf("the key's limit is %d, want the floor %d", got, floor)
	}
	// At 10 a second with a burst of 1, a second request waits 100ms less
	// the time since the first, which the two calls' took bounds; at the
	// ceiling it would be 1ms less that.
	if ra, took := retryAfter(t, pool, schema); ra+took < time.Second/floor*9/10 {
		t.Errorf("at the floor the limiter makes a second request, %s after the first began, wait %s, want %s less the time between them", took, ra, time.Second/floor)
	}

	// 3. Recovery.
	p.off()
	nextSample(t, samples, "healthy", func(s pglimithealth.State) bool { return !s.Over })
	nextSample(t, samples, "back at the ceiling", func(s pglimithealth.State) bool { return s.Rate == ceiling })
	if got := keyRate(t, pool, schema); got != ceiling {
		t.Fatalf("after recovery the key's limit is %d, want %d", got, ceiling)
	}

	// 4. Trouble, and the leader is killed.
	p.on()
	nextSample(t, samples, "at the floor again", func(s pglimithealth.State) bool { return s.Rate == floor })
	before := drain(samples)
	if before.Samples == 0 {
		before = status(t, pool, schema)
	}
	var killed int
	key := pglimithealth.LockKey(a)
	if err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid))::int FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1
		  AND classid::bigint = ($1::bigint >> 32) AND objid::bigint = ($1::bigint & 4294967295)`, key).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("killing the leader's session: %d killed, %v", killed, err)
	}
	after := nextSample(t, samples, "by the next leader", func(s pglimithealth.State) bool { return s.Samples > before.Samples })
	if after.Rate != floor {
		t.Errorf("the next leader's first sample %v: want the floor, carried on", after)
	}
	// Cost: one sample a period per cluster, however many instances.
	// Every sample counts in Samples; over the whole run there can be no
	// more than one a period (plus the first).
	st := status(t, pool, schema)
	if most := int64(time.Since(began)/period) + 1; st.Samples > most {
		t.Errorf("%d samples in %s: more than one a period (%d) across two instances", st.Samples, time.Since(began), most)
	}

	// 5. No leader at all: the rate holds.
	for _, th := range []*pglimithealth.Throttle{a, a2} {
		if err := th.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held := status(t, pool, schema)
	p.off()
	time.Sleep(5 * period)
	if st := status(t, pool, schema); st.Rate != floor || st.Samples != held.Samples {
		t.Fatalf("with no leader the state moved: %v, then %v", held, st)
	}
	if got := keyRate(t, pool, schema); got != floor {
		t.Fatalf("with no leader the key's limit became %d; it must hold the floor %d", got, floor)
	}
	drain(samples)
	start(t, pool, config("b"))
	b := nextSample(t, samples, "by the new instance", func(pglimithealth.State) bool { return true })
	// It carries on from the floor: one increase, or none where the signal
	// is still over its threshold (WAL a second stays high while the
	// server catches up on the pressure's writes).
	if b.Leader != "b" || b.Samples != held.Samples+1 || b.Rate != floor+500 && !(b.Over && b.Rate == floor) {
		t.Errorf("the new leader's first sample %v: want b's, number %d, the floor plus one increase (or the floor, still over)", b, held.Samples+1)
	}
}

// replicaPair starts a durable local cluster and a streaming standby of
// it, for the calling test alone.
func replicaPair(t *testing.T) (primary, standby *pgserver.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	primary, err := pgserver.Start(ctx, &pgserver.Config{Prefer: pgserver.KindLocal, BinDir: os.Getenv(testdb.EnvPGBin), Durable: true})
	if err != nil {
		testdb.Missing(t, "a primary and a standby need PostgreSQL's server binaries (apt-get install postgresql): %v", err)
	}
	t.Cleanup(func() {
		if err := primary.Close(); err != nil {
			t.Errorf("primary: %v", err)
		}
	})
	if standby, err = primary.Standby(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := standby.Close(); err != nil {
			t.Errorf("standby: %v", err)
		}
	})
	return primary, standby
}

// The standby's replay is paused under write load: replication lag grows
// past 0.5s (or 256 kB of WAL), as the primary sees it and as the standby
// itself does, the rate falls to the floor, and recovers after the replay
// resumes.
func TestReplicationLagThrottle(t *testing.T) {
	testdb.Slow(t)
	primary, standby := replicaPair(t)
	pp, sp := testdb.PoolOn(t, primary.URL()), testdb.PoolOn(t, standby.URL())
	if _, err := pp.Exec(t.Context(), "CREATE TABLE public.load (id bigint, pad text)"); err != nil {
		t.Fatal(err)
	}
	var (
		stop func()
		wg   sync.WaitGroup
	)
	exec := func(pool *pgxpool.Pool, sql string) {
		t.Helper()
		if _, err := pool.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	p := pressure{
		on: func() {
			exec(sp, "SELECT pg_wal_replay_pause()")
			ctx, cancel := context.WithCancel(t.Context())
			stop = func() { cancel(); wg.Wait() }
			wg.Go(func() {
				for ctx.Err() == nil {
					_, _ = pp.Exec(ctx, "INSERT INTO public.load SELECT g, repeat('x', 100) FROM generate_series(1, 100) g")
					time.Sleep(10 * time.Millisecond)
				}
			})
		},
		off: func() {
			stop()
			exec(sp, "SELECT pg_wal_replay_resume()")
		},
	}
	for _, sig := range []pglimithealth.Signal{
		{Kind: pglimithealth.ReplicationLag, Threshold: 0.5},
		{Kind: pglimithealth.ReplicationLagBytes, Threshold: 256 << 10},
		{Kind: pglimithealth.StandbyReplayDelay, Threshold: 0.5},
	} {
		var standbys []*pgxpool.Pool
		if sig.Kind == pglimithealth.StandbyReplayDelay {
			standbys = []*pgxpool.Pool{sp}
		}
		t.Run(string(sig.Kind), func(t *testing.T) { scenario(t, primary.URL(), sig, p, standbys...) })
	}
}

// A standby cut off from its primary reads as behind by the age of the
// last transaction it replayed, where the primary sees no standby at all.
// A standby that stops answering (its processes stopped, as when its host
// goes silent), and then one shut down, counts as infinitely behind from
// the first sample that begins after: the rate falls to the floor at the
// sample after that, and climbs back once the standby answers again.
func TestStandbyUnreachable(t *testing.T) {
	testdb.Slow(t)
	primary, standby := replicaPair(t)
	t.Cleanup(func() { _ = standby.Thaw() }) // before replicaPair's Close
	pp, sp := testdb.PoolOn(t, primary.URL()), testdb.PoolOn(t, standby.URL())
	schema := testdb.SchemaOn(t, primary.URL(), nil)
	samples := make(chan pglimithealth.State, 1000)
	var log syncBuffer
	cfg := throttleConfig(schema, "a", pglimithealth.Signal{Kind: pglimithealth.StandbyReplayDelay, Threshold: 5}, samples)
	cfg.Standbys = []*pgxpool.Pool{sp}
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	start(t, pp, cfg)
	nextSample(t, samples, "at the ceiling", func(s pglimithealth.State) bool { return s.Rate == ceiling })

	// lagging checks that the standby, out of reach since just before,
	// counts as infinitely behind by the second sample from now: the
	// first may have read it before. The floor comes at the next.
	lagging := func(what string) {
		t.Helper()
		began := time.Now()
		latest := status(t, pp, schema).Samples
		over := nextSample(t, samples, what+": over", func(s pglimithealth.State) bool { return s.Over })
		low := nextSample(t, samples, what+": at the floor", func(s pglimithealth.State) bool { return s.Rate == floor })
		t.Logf("%s: %s after, %v; then %v", what, time.Since(began), over, low)
		if over.Samples > latest+2 || !math.IsInf(over.Value, 1) || over.Signal != pglimithealth.StandbyReplayDelay || over.Rate != ceiling/10 {
			t.Errorf("%s: the first sample over is %v; want number %d at the latest, of %s, +Inf, rate %d",
				what, over, latest+2, pglimithealth.StandbyReplayDelay, ceiling/10)
		}
		if low.Samples != over.Samples+1 {
			t.Errorf("%s: the floor at sample %d, want the next after %d", what, low.Samples, over.Samples)
		}
		// A silent standby is given up after max(Period, 1s): samples
		// go on, at most that much apart plus a period and a statement.
		if gap := low.SampledAt.Sub(over.SampledAt); gap > 10*time.Second {
			t.Errorf("%s: samples %s apart with the standby out of reach", what, gap)
		}
		if st := status(t, pp, schema); !strings.Contains(st.String(), "standby_replay_delay +Inf > 5") {
			t.Errorf("%s: Status says %q", what, st)
		}
	}

	// Cut off: no primary_conninfo, so its WAL receiver stops. It has
	// replayed all it received; the throttle's own samples commit on the
	// primary every period, and it replays none of them.
	var conninfo string
	if err := sp.QueryRow(t.Context(), "SHOW primary_conninfo").Scan(&conninfo); err != nil || conninfo == "" {
		t.Fatalf("primary_conninfo %q, %v", conninfo, err)
	}
	setConninfo := func(v string) {
		t.Helper()
		var stmt string
		if err := sp.QueryRow(t.Context(), "SELECT format('ALTER SYSTEM SET primary_conninfo = %L', $1::text)", v).Scan(&stmt); err != nil {
			t.Fatal(err)
		}
		if _, err := sp.Exec(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
		if _, err := sp.Exec(t.Context(), "SELECT pg_reload_conf()"); err != nil {
			t.Fatal(err)
		}
	}
	setConninfo("")
	over := nextSample(t, samples, "cut off: over", func(s pglimithealth.State) bool { return s.Over })
	var connected int
	if err := pp.QueryRow(t.Context(), "SELECT count(*) FROM pg_stat_replication").Scan(&connected); err != nil || connected != 0 {
		t.Errorf("the primary sees %d standbys (%v); want none, cut off", connected, err)
	}
	t.Logf("cut off: %v", over)
	if over.Signal != pglimithealth.StandbyReplayDelay || math.IsInf(over.Value, 0) || over.Value <= 5 {
		t.Errorf("cut off: %v; want the standby's finite delay past 5s", over)
	}
	nextSample(t, samples, "cut off: at the floor", func(s pglimithealth.State) bool { return s.Rate == floor })
	setConninfo(conninfo)
	nextSample(t, samples, "streaming again: healthy", func(s pglimithealth.State) bool { return !s.Over })
	nextSample(t, samples, "streaming again: at the ceiling", func(s pglimithealth.State) bool { return s.Rate == ceiling })

	if err := standby.Freeze(); err != nil {
		t.Fatal(err)
	}
	lagging("frozen")
	if !strings.Contains(log.String(), "cannot be read") {
		t.Errorf("no log line says the standby cannot be read: %s", log.String())
	}
	if err := standby.Thaw(); err != nil {
		t.Fatal(err)
	}
	nextSample(t, samples, "healthy once thawed", func(s pglimithealth.State) bool { return !s.Over })
	nextSample(t, samples, "back at the ceiling", func(s pglimithealth.State) bool { return s.Rate == ceiling })
	if !strings.Contains(log.String(), "can be read again") {
		t.Errorf("no log line says the standby can be read again: %s", log.String())
	}

	if err := standby.Close(); err != nil {
		t.Fatal(err)
	}
	lagging("shut down")
}

// A standby pool whose role lacks pg_read_all_stats (which
// pg_stat_wal_receiver's status needs) fails every sample with ErrNoStats,
// in the log: nothing is written.
func TestStandbyRoleWithoutStats(t *testing.T) {
	testdb.Slow(t)
	primary, standby := replicaPair(t)
	pp := testdb.PoolOn(t, primary.URL())
	schema := testdb.SchemaOn(t, primary.URL(), nil)
	if _, err := pp.Exec(t.Context(), "CREATE ROLE nostats LOGIN"); err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(standby.URL())
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.User = "nostats"
	sp, err := pgxpool.NewWithConfig(t.Context(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.Close)
	// The role reaches the standby with the WAL that creates it.
	for deadline := time.Now().Add(patience); sp.Ping(t.Context()) != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the role never reached the standby")
		}
	}
	samples := make(chan pglimithealth.State, 100)
	var log syncBuffer
	cfg := throttleConfig(schema, "a", pglimithealth.Signal{Kind: pglimithealth.StandbyReplayDelay, Threshold: 5}, samples)
	cfg.Standbys = []*pgxpool.Pool{sp}
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	th := start(t, pp, cfg)
	for deadline := time.Now().Add(patience); !strings.Contains(log.String(), pglimithealth.ErrNoStats.Error()); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line says ErrNoStats: %s", log.String())
		}
	}
	if !th.Leader() || len(samples) != 0 {
		t.Errorf("leader %t, %d samples; want the leader, with none", th.Leader(), len(samples))
	}
	if st, err := pglimithealth.Status(t.Context(), pp, schema, ""); err != nil || len(st) != 0 {
		t.Errorf("Status: %v, %v; want nothing written", st, err)
	}
}

// A pool of Standbys that reaches a primary fails every sample with
// ErrNotStandby, in the log: nothing is written, so no rate is set.
func TestStandbyNotAStandby(t *testing.T) {
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	samples := make(chan pglimithealth.State, 100)
	var log syncBuffer
	cfg := throttleConfig(schema, "a", pglimithealth.Signal{Kind: pglimithealth.StandbyReplayDelay, Threshold: 5}, samples)
	cfg.Period = 50 * time.Millisecond
	cfg.Standbys = []*pgxpool.Pool{pool}
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	th := start(t, pool, cfg)
	for deadline := time.Now().Add(patience); !strings.Contains(log.String(), pglimithealth.ErrNotStandby.Error()); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line says ErrNotStandby: %s", log.String())
		}
	}
	time.Sleep(5 * cfg.Period)
	if !th.Leader() || len(samples) != 0 {
		t.Errorf("leader %t, %d samples; want the leader, with none", th.Leader(), len(samples))
	}
	if st, err := pglimithealth.Status(t.Context(), pool, schema, ""); err != nil || len(st) != 0 {
		t.Errorf("Status: %v, %v; want nothing written", st, err)
	}
	if own, err := pglimit.ListKeyLimits(t.Context(), testdb.Limiter(t, pool, cfg.Limiter), "", 10); err != nil || len(own) != 0 {
		t.Errorf("the key's limits: %+v, %v; want none written", own, err)
	}
}

// Sessions that sit in pg_sleep push the active sessions past the
// threshold; ending them lets the rate recover. On a server of its own,
// so that no other test's sessions count.
func TestActiveSessionsThrottle(t *testing.T) {
	testdb.Slow(t)
	url := testdb.OwnServer(t).URL()
	pool := testdb.PoolOn(t, url)
	const sleepers = 8
	var active, maxConns float64
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid()),
		current_setting('max_connections')::float8 FROM pg_stat_activity`).Scan(&active, &maxConns); err != nil {
		t.Fatal(err)
	}
	threshold := (active + sleepers/2) / maxConns
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = sleepers
	sleepPool, err := pgxpool.NewWithConfig(t.Context(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sleepPool.Close)
	var (
		stop func()
		wg   sync.WaitGroup
	)
	p := pressure{
		on: func() {
			ctx, cancel := context.WithCancel(t.Context())
			stop = func() { cancel(); wg.Wait() }
			for range sleepers {
				wg.Go(func() {
					for ctx.Err() == nil {
						_, _ = sleepPool.Exec(ctx, "SELECT pg_sleep(60)")
					}
				})
			}
		},
		off: func() { stop() },
	}
	scenario(t, url, pglimithealth.Signal{Kind: pglimithealth.ActiveSessions, Threshold: threshold}, p)
}

// Bad input is ErrInvalidConfig, before any I/O: nothing is written.
func TestInvalidConfig(t *testing.T) {
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	good := func() *pglimithealth.Config {
		return throttleConfig(schema, "x", pglimithealth.Signal{Kind: pglimithealth.LockWaiters, Threshold: 1}, nil)
	}
	for name, change := range map[string]func(c *pglimithealth.Config){
		"floor above ceiling":     func(c *pglimithealth.Config) { c.Floor = c.Ceiling + 1 },
		"zero floor":              func(c *pglimithealth.Config) { c.Floor = 0 },
		"ceiling past the period": func(c *pglimithealth.Config) { c.Ceiling = 1_000_001 },
		"zero period":             func(c *pglimithealth.Config) { c.Period = 0 },
		"negative period":         func(c *pglimithealth.Config) { c.Period = -time.Second },
		"unknown signal":          func(c *pglimithealth.Config) { c.Signals[0].Kind = "cpu" },
		"no signals":              func(c *pglimithealth.Config) { c.Signals = nil },
		"signal twice":            func(c *pglimithealth.Config) { c.Signals = append(c.Signals, c.Signals[0]) },
		"zero threshold":          func(c *pglimithealth.Config) { c.Signals[0].Threshold = 0 },
		"NaN threshold":           func(c *pglimithealth.Config) { c.Signals[0].Threshold = math.NaN() },
		"infinite threshold":      func(c *pglimithealth.Config) { c.Signals[0].Threshold = math.Inf(1) },
		"decrease of 1":           func(c *pglimithealth.Config) { c.Decrease = 1 },
		"zero decrease":           func(c *pglimithealth.Config) { c.Decrease = 0 },
		"zero increase":           func(c *pglimithealth.Config) { c.Increase = 0 },
		"no limiter":              func(c *pglimithealth.Config) { c.Limiter = nil },
		"limiter without overrides": func(c *pglimithealth.Config) {
			c.Limiter.Overrides = false
		},
		"unknown limit": func(c *pglimithealth.Config) { c.Limit = "other" },
		"empty name":    func(c *pglimithealth.Config) { c.Name = "" },
		"empty key":     func(c *pglimithealth.Config) { c.Key = "" },
		"standby signal without standbys": func(c *pglimithealth.Config) {
			c.Signals[0] = pglimithealth.Signal{Kind: pglimithealth.StandbyReplayDelay, Threshold: 5}
		},
		"standbys without the signal": func(c *pglimithealth.Config) { c.Standbys = []*pgxpool.Pool{pool} },
		"nil standby pool": func(c *pglimithealth.Config) {
			c.Signals[0] = pglimithealth.Signal{Kind: pglimithealth.StandbyReplayDelay, Threshold: 5}
			c.Standbys = []*pgxpool.Pool{pool, nil}
		},
		"burst too slow at the floor": func(c *pglimithealth.Config) {
			c.Limiter.Limits[0].Period, c.Limiter.Limits[0].Burst = 24*time.Hour, 1000
			c.Floor, c.Ceiling = 1, 1
		},
	} {
		cfg := good()
		change(cfg)
		if _, err := pglimithealth.New(pool, cfg); !errors.Is(err, pglimithealth.ErrInvalidConfig) {
			t.Errorf("%s: New: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := pglimithealth.New(nil, good()); !errors.Is(err, pglimithealth.ErrInvalidConfig) {
		t.Errorf("nil pool: %v, want ErrInvalidConfig", err)
	}
	if _, err := pglimithealth.New(pool, nil); !errors.Is(err, pglimithealth.ErrInvalidConfig) {
		t.Errorf("nil Config: %v, want ErrInvalidConfig", err)
	}
	if _, err := pglimithealth.Status(t.Context(), pool, "bad schema", ""); !errors.Is(err, pglimithealth.ErrInvalidConfig) {
		t.Errorf("Status of a bad schema name: %v, want ErrInvalidConfig", err)
	}
	var rows int
	if err := pool.QueryRow(t.Context(), fmt.Sprintf(`SELECT (SELECT count(*) FROM %[1]q.pglimit_health) + (SELECT count(*) FROM %[1]q.pglimit_overrides)`, schema)).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("after refused configurations: %d rows written, %v", rows, err)
	}
	if _, err := pglimithealth.New(pool, good()); err != nil {
		t.Errorf("the good configuration: %v", err)
	}
}

// A write load pushes the WAL written a second past the threshold;
// stopping it lets the rate recover. On a server of its own, so that no
// other test's writes count.
func TestWALRateThrottle(t *testing.T) {
	testdb.Slow(t)
	url := testdb.OwnServer(t).URL()
	pool := testdb.PoolOn(t, url)
	if _, err := pool.Exec(t.Context(), "CREATE TABLE public.load (id bigint, pad text)"); err != nil {
		t.Fatal(err)
	}
	var (
		stop func()
		wg   sync.WaitGroup
	)
	p := pressure{
		on: func() {
			ctx, cancel := context.WithCancel(t.Context())
			stop = func() { cancel(); wg.Wait() }
			wg.Go(func() {
				for ctx.Err() == nil {
					_, _ = pool.Exec(ctx, "INSERT INTO public.load SELECT g, repeat('x', 100) FROM generate_series(1, 1000) g")
				}
			})
		},
		off: func() { stop() },
	}
	// 500 kB a second: the throttle's own writes are a few kB a second,
	// the load several MB.
	scenario(t, url, pglimithealth.Signal{Kind: pglimithealth.WALRate, Threshold: 500_000}, p)
}
