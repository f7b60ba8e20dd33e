package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/pgserver"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitprom"
)

// The chaos soak (-soak D): two instances decide, for D, on a mix of keys
// (a cooldown, general limits, a busy key that leases) while faults are
// injected at random into a primary with a synchronous standby; then every
// admission is audited, from the database record and from the clients'
// timings. Its servers are local clusters of its own.

// soakAppName marks the soak's pools, whose backends a fault terminates.
const soakAppName = "pglimit-soak"

// The soak's limits.
var (
	soakCooldown = time.Second
	soakGeneral  = []pglimit.Limit{
		{Name: "per-second", Rate: 10, Period: time.Second, Burst: 5},
		{Name: "per-minute", Rate: 200, Period: time.Minute, Algorithm: pglimit.FixedWindow},
	}
	soakBusy = pglimit.Limit{Name: "busy", Rate: 5000, Period: time.Second, Burst: 500}
)

// soakKind is one of the soak's limiters, and what its callers saw.
type soakKind struct {
	name    string
	v       variant
	workers int // per instance
	key     func(r *rand.Rand) string
	cfg     func(schema string) *pglimit.Config

	mu        sync.Mutex
	decisions int
	admitted  map[string][]admission
}

func (k *soakKind) note(key string, sent, received time.Duration, allowed bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.decisions++
	if allowed {
		k.admitted[key] = append(k.admitted[key], admission{sent: sent, received: received})
	}
}

// soakRun is what the soak saw.
type soakRun struct {
	duration time.Duration
	faults   []string // "offset kind", in order
	errors   map[string]int
	longest  time.Duration
	kinds    []*soakKind
	checks   []soakCheck
}

type soakCheck struct {
	name string
	c    admissionCheck
}

func (run *soakRun) ok() bool {
	return !slices.ContainsFunc(run.checks, func(c soakCheck) bool { return !c.c.ok() })
}

func runSoak(ctx context.Context, o *options, stdout, stderr io.Writer) int {
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "loadtest: "+format+"\n", args...) }
	run, err := soak(ctx, o.soak, logf)
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "loadtest: interrupted")
		return exitInterrupted
	}
	if err != nil {
		fmt.Fprintln(stderr, "loadtest: soak:", err)
		return exitError
	}
	run.write(stdout)
	if !run.ok() {
		fmt.Fprintln(stderr, "FAIL: the soak over-admitted")
		return exitFailed
	}
	fmt.Fprintln(stderr, "loadtest: PASS")
	return exitOK
}

// soakServers is the soak's primary and standby, each behind a faultProxy,
// and which of them is the primary now.
type soakServers struct {
	srv     [2]*pgserver.Server
	proxy   [2]*faultProxy
	primary int
}

func (s *soakServers) close() {
	for i := range 2 {
		if s.proxy[i] != nil {
			s.proxy[i].close()
		}
		if s.srv[i] != nil {
			_ = s.srv[i].Close()
		}
	}
}

// urls returns a multi-host URL of both servers, direct and through the
// proxies, that reaches whichever is the primary.
func (s *soakServers) urls() (direct, proxied string) {
	var hosts, proxies []string
	for i := range 2 {
		u, _ := url.Parse(s.srv[i].URL())
		hosts = append(hosts, u.Host)
		proxies = append(proxies, s.proxy[i].addr())
	}
	q := "/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2"
	return "postgres://postgres@" + strings.Join(hosts, ",") + q,
		"postgres://postgres@" + strings.Join(proxies, ",") + q + "&application_name=" + soakAppName
}

func startSoakServers(ctx context.Context, logf func(string, ...any)) (*soakServers, error) {
	s := &soakServers{}
	var err error
	if s.srv[0], err = pgserver.Start(ctx, &pgserver.Config{Prefer: pgserver.KindLocal, Durable: true, Logf: logf}); err != nil {
		return nil, fmt.Errorf("the soak needs PostgreSQL's server binaries (apt-get install postgresql): %w", err)
	}
	if s.srv[1], err = s.srv[0].Standby(ctx); err != nil {
		s.close()
		return nil, err
	}
	// After the base backup, so that the standby, once promoted, waits for
	// no standby of its own.
	if err := execOn(ctx, s.srv[0].URL(), "ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"); err != nil {
		s.close()
		return nil, err
	}
	for i := range 2 {
		u, _ := url.Parse(s.srv[i].URL())
		if s.proxy[i], err = newFaultProxy(u.Host); err != nil {
			s.close()
			return nil, err
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var state string
		err := queryOn(ctx, s.srv[0].URL(), "SELECT sync_state FROM pg_stat_replication", &state)
		if err == nil && state == "sync" {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.close()
			return nil, fmt.Errorf("no synchronous standby after 30s (%s, %v)", state, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// execOn runs stmts on a connection of its own to url.
func execOn(ctx context.Context, url string, stmts ...string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

func queryOn(ctx context.Context, url, sql string, dest ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql).Scan(dest...)
}

func soak(ctx context.Context, d time.Duration, logf func(string, ...any)) (*soakRun, error) {
	servers, err := startSoakServers(ctx, logf)
	if err != nil {
		return nil, err
	}
	defer servers.close()
	direct, proxied := servers.urls()
	db, err := openDatabase(ctx, direct, soakAppName)
	if err != nil {
		return nil, err
	}
	defer db.close()

	kinds := []*soakKind{
		{name: "cooldown", workers: 4, key: func(r *rand.Rand) string { return fmt.Sprintf("c%03d", r.IntN(100)) },
			cfg: func(schema string) *pglimit.Config { return &pglimit.Config{Schema: schema, Cooldown: soakCooldown} }},
		{name: "general", workers: 2, key: func(r *rand.Rand) string { return fmt.Sprintf("g%02d", r.IntN(20)) },
			cfg: func(schema string) *pglimit.Config { return &pglimit.Config{Schema: schema, Limits: soakGeneral} }},
		{name: "busy", workers: 4, key: func(*rand.Rand) string { return "busy" },
			cfg: func(schema string) *pglimit.Config {
				return &pglimit.Config{Schema: schema, Limits: []pglimit.Limit{soakBusy}}
			}},
	}
	var vs []variant
	for _, k := range kinds {
		k.v = variant{Name: "soak-" + k.name, Strategy: pglimit.Upsert}
		k.admitted = map[string][]admission{}
		vs = append(vs, k.v)
	}
	runID := fmt.Sprintf("%x", time.Now().UnixNano()&0xffffff)
	if err := db.setup(ctx, runID, vs); err != nil {
		return nil, err
	}
	for _, v := range vs {
		if err := db.prepare(ctx, v, true, nil); err != nil {
			return nil, err
		}
	}
	dbStart, err := db.now(ctx)
	if err != nil {
		return nil, err
	}

	// Every instance's pool and limiters first, so that an error leaves no
	// worker running.
	type worker struct {
		k    *soakKind
		lim  pglimit.Limiter
		seed uint64
	}
	var workers []worker
	for inst := range 2 {
		cfg, err := pgxpool.ParseConfig(proxied)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = 8
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		for _, k := range kinds {
			lim, err := pglimit.New(pool, k.cfg(db.schemas[k.v.Name]))
			if err != nil {
				return nil, err
			}
			for w := range k.workers {
				workers = append(workers, worker{k: k, lim: lim, seed: uint64(inst)<<8 | uint64(w)})
			}
		}
	}

	run := &soakRun{duration: d, errors: map[string]int{}, kinds: kinds}
	var mu sync.Mutex // guards run.errors and run.longest
	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(w.seed, 0))
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := w.k.key(r)
				sent := time.Since(start)
				dec, err := w.lim.Allow(ctx, key)
				received := time.Since(start)
				mu.Lock()
				run.longest = max(run.longest, received-sent)
				if err != nil {
					run.errors[w.k.name+" "+pglimitprom.ErrorKind(err)]++
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(10 * time.Millisecond) // no busy loop while no server answers
					continue
				}
				w.k.note(key, sent, received, dec.Allowed)
			}
		})
	}

	faults, err := injectFaults(ctx, servers, d, start, logf)
	run.faults = faults
	close(stop)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	for i := range 2 {
		servers.proxy[i].unstall()
	}
	return run, run.audit(ctx, db, dbStart)
}

// injectFaults injects a fault every 4 to 10 s for d, and a failover
// half-way (or once the fault under way then has ended), and returns what
// it did: when each fault began, by offset from start, and how long it
// took.
func injectFaults(ctx context.Context, s *soakServers, d time.Duration, start time.Time, logf func(string, ...any)) ([]string, error) {
	r := rand.New(rand.NewPCG(uint64(start.UnixNano()), 0))
	var (
		done  []string
		begin time.Duration // when the fault began
	)
	note := func(what string) {
		line := fmt.Sprintf("%6.1fs %s (%.1fs)", begin.Seconds(), what, (time.Since(start) - begin).Seconds())
		done = append(done, line)
		logf("soak: %s", line)
	}
	failedOver := false
	for time.Since(start) < d {
		wait := min(4*time.Second+time.Duration(r.Int64N(int64(6*time.Second))), d-time.Since(start))
		failover := !failedOver && time.Since(start)+wait >= d/2
		if failover {
			wait = d/2 - time.Since(start)
		}
		select {
		case <-ctx.Done():
			return done, ctx.Err()
		case <-time.After(wait):
		}
		if time.Since(start) >= d {
			break
		}
		p := s.primary
		begin = time.Since(start)
		if failover {
			failedOver = true
			if err := s.srv[p].Kill(); err != nil {
				return done, err
			}
			if err := execOn(ctx, s.srv[1-p].URL(), "SELECT pg_promote()"); err != nil {
				return done, fmt.Errorf("promote: %w", err)
			}
			s.primary = 1 - p
			note("failover: the primary's postmaster killed, the synchronous standby promoted")
			continue
		}
		switch r.IntN(4) {
		case 0:
			if err := s.srv[p].Kill(); err != nil {
				return done, err
			}
			if err := s.srv[p].Restart(ctx, true); err != nil {
				return done, fmt.Errorf("restart after kill -9: %w", err)
			}
			note("kill -9 of the primary's postmaster, then a restart")
		case 1:
			var n int
			if err := queryOn(ctx, s.srv[p].URL(),
				"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '"+soakAppName+"'", &n); err != nil {
				return done, fmt.Errorf("terminate: %w", err)
			}
			note(fmt.Sprintf("pg_terminate_backend of the limiters' %d sessions", n))
		case 2:
			stall := time.Second + time.Duration(r.Int64N(int64(2*time.Second)))
			s.proxy[p].stall()
			time.Sleep(stall)
			s.proxy[p].unstall()
			note(fmt.Sprintf("the network to the primary stalled for %.1fs", stall.Seconds()))
		case 3:
			s.proxy[p].drop()
			note("every connection to the primary dropped")
		}
	}
	return done, nil
}

// audit checks every admission of the run: from the clients' timings, and
// from the new primary's record.
func (run *soakRun) audit(ctx context.Context, db *database, dbStart time.Time) error {
	// The last fault may have left the primary restarting.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := db.now(ctx); err == nil {
			break
		} else if time.Now().After(deadline) {
			return fmt.Errorf("no primary to audit: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, k := range run.kinds {
		switch k.name {
		case "cooldown":
			run.add("cooldown, clients", checkClient(k.admitted, soakCooldown, nil))
			byKey, _, err := db.record(ctx, k.v, true)
			if err != nil {
				return err
			}
			offsets := map[string][]time.Duration{}
			for key, ts := range byKey {
				for _, t := range ts {
					offsets[key] = append(offsets[key], t.Sub(dbStart)-soakCooldown)
				}
			}
			run.add("cooldown, record", checkRecord(offsets, soakCooldown, nil))
		case "general":
			run.add("general limits, clients", checkClientLimits(k.admitted, soakGeneral))
			byKey, err := db.recordLimits(ctx, k.v, soakGeneral)
			if err != nil {
				return err
			}
			run.add("general limits, record", checkRecordLimits(byKey, soakGeneral))
		case "busy":
			run.add("busy key, clients", checkClientLimits(k.admitted, []pglimit.Limit{soakBusy}))
			writes, err := db.recordWrites(ctx, k.v)
			if err != nil {
				return err
			}
			run.add("busy key, record", checkRecordLeases(writes, soakBusy, map[string]int{"busy": len(k.admitted["busy"])}))
		default:
			return errors.New("soak: unknown kind " + k.name)
		}
	}
	return nil
}

func (run *soakRun) add(name string, c admissionCheck) {
	run.checks = append(run.checks, soakCheck{name: name, c: c})
}

func (run *soakRun) write(w io.Writer) {
	fmt.Fprintf(w, "soak: %s, two instances, a primary with a synchronous standby (durable defaults)\n", run.duration)
	fmt.Fprintf(w, "faults (%d):\n", len(run.faults))
	for _, f := range run.faults {
		fmt.Fprintf(w, "  %s\n", f)
	}
	for _, k := range run.kinds {
		n := 0
		for _, a := range k.admitted {
			n += len(a)
		}
		fmt.Fprintf(w, "%-8s %8d decisions, %8d admitted\n", k.name, k.decisions, n)
	}
	fmt.Fprintf(w, "errors by kind:")
	for _, e := range slices.Sorted(maps.Keys(run.errors)) {
		fmt.Fprintf(w, " %s %d;", e, run.errors[e])
	}
	fmt.Fprintf(w, "\nlongest decision: %s\n", run.longest.Round(time.Millisecond))
	for _, c := range run.checks {
		verdict := "ok"
		if !c.c.ok() {
			verdict = "OVER-ADMITTED"
		}
		fmt.Fprintf(w, "%-24s %s: %d admitted, at most %d allowed, %d over, %d violations\n",
			c.name, verdict, c.c.Admitted, c.c.MaxAllowed, c.c.OverAdmitted, c.c.Violations)
	}
}
