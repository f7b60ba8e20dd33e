package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/internal/pgserver"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
)

// replicaPair starts a durable local cluster and a streaming standby of
// it, for the calling test alone. It needs PostgreSQL's server binaries
// (a container has no standby here).
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

// serverPool is a pool of url with an empty search_path, closed when the
// test ends.
func serverPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// makeSynchronous makes the standby of primary, the pool's server,
// synchronous (synchronous_standby_names '*'), and waits until it is.
func makeSynchronous(t *testing.T, primary *pgxpool.Pool) {
	t.Helper()
	for _, stmt := range []string{"ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"} {
		if _, err := primary.Exec(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "a synchronous standby", func() bool {
		var state string
		err := primary.QueryRow(t.Context(), "SELECT sync_state FROM pg_stat_replication").Scan(&state)
		return err == nil && state == "sync"
	})
}

// caughtUp waits until standby has replayed everything primary has
// written so far.
func caughtUp(t *testing.T, primary, standby *pgxpool.Pool) {
	t.Helper()
	var lsn string
	if err := primary.QueryRow(t.Context(), "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the standby to replay "+lsn, func() bool {
		var done bool
		err := standby.QueryRow(t.Context(), "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&done)
		return err == nil && done
	})
}

// A limiter pointed at a standby fails with ErrReadOnly: every strategy's
// Allow, AllowTx and Reset, a pool that asks for a read-write server and
// finds only the standby, and Migrate, whether the schema was migrated on
// the primary or never (then not ErrExtension either). No error names Citus, which these servers do not
// have. Peek reads the replicated state.
func TestReadOnlyServer(t *testing.T) {
	testdb.Slow(t)
	t.Parallel()
	ctx := t.Context()
	primary, standby := replicaPair(t)
	pp, sp := serverPool(t, primary.URL()), serverPool(t, standby.URL())
	const schema = "replicated"
	if err := pglimit.Migrate(ctx, pp, schema); err != nil {
		t.Fatal(err)
	}
	newLim := func(db pglimit.DB, s pglimit.Strategy) pglimit.Limiter {
		t.Helper()
		cfg := &pglimit.Config{Strategy: s, Schema: schema, Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 2}}}
		if s == pglimit.Range {
			cfg.Limits, cfg.Cooldown = nil, time.Hour
		}
		lim, err := pglimit.New(db, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}
	onPrimary := map[pglimit.Strategy]pglimit.Decision{}
	for _, s := range pglimit.Strategies() {
		lim := newLim(pp, s)
		if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("%s on the primary: %+v, %v", s, d, err)
		}
		p, err := lim.Peek(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		onPrimary[s] = p
	}
	caughtUp(t, pp, sp)

	readOnly := func(what string, err error) {
		t.Helper()
		switch {
		case !errors.Is(err, pglimit.ErrReadOnly):
			t.Errorf("%s: %v; want ErrReadOnly", what, err)
		case strings.Contains(err.Error(), "Citus"):
			t.Errorf("%s: %v names Citus", what, err)
		}
	}
	readWrite := serverPool(t, fmt.Sprintf("%s&target_session_attrs=read-write", standby.URL()))
	for _, s := range pglimit.Strategies() {
		lim := newLim(sp, s)
		d, err := lim.Allow(ctx, "k")
		readOnly(fmt.Sprintf("%s Allow", s), err)
		if d.Allowed {
			t.Errorf("%s: the standby admitted", s)
		}
		readOnly(fmt.Sprintf("%s Reset", s), lim.Reset(ctx, "k"))
		tx, err := sp.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = lim.AllowTx(ctx, tx, "k")
		readOnly(fmt.Sprintf("%s AllowTx", s), err)
		if err := tx.Rollback(ctx); err != nil {
			t.Errorf("%s: the caller's transaction: %v", s, err)
		}
		if p, err := lim.Peek(ctx, "k", 1); err != nil || p.Allowed != onPrimary[s].Allowed || p.Remaining != onPrimary[s].Remaining {
			t.Errorf("%s Peek on the standby: %+v, %v; on the primary %+v", s, p, err, onPrimary[s])
		}

		_, err = newLim(readWrite, s).Allow(ctx, "k")
		readOnly(fmt.Sprintf("%s Allow, target_session_attrs=read-write", s), err)
	}
	readOnly("Migrate, migrated", pglimit.Migrate(ctx, sp, schema))
	readOnly("Migrate, a new schema", pglimit.Migrate(ctx, sp, "never"))
	err := pglimit.Migrate(ctx, sp, "public")
	readOnly("Migrate, public, never migrated", err)
	if errors.Is(err, pglimit.ErrExtension) {
		t.Errorf("Migrate on a standby: %v; the extension is not what is missing", err)
	}
}

// seen is one call of a failover run, as its caller saw it.
type seen struct {
	key        string
	sent, recv time.Time
	allowed    bool
	err        error
}

// failoverRun is what a failover left behind.
type failoverRun struct {
	calls  []seen
	record []auditRow // the new primary's record of admissions
}

// failover decides keys under a cooldown from 8 workers (every other call
// on one of 200 keys, the others on a new key each), through a pool
// that follows the primary (a multi-host URL with
// target_session_attrs=read-write), kills the primary's postmaster alone,
// promotes the standby, and decides on. With synchronous, the standby is
// synchronous (synchronous_standby_names '*', synchronous_commit on);
// retry, if not empty, is its wal_retrieve_retry_interval.
// Two Cleaners and an Invalidator run through the same pool's hosts: after
// the failover one Cleaner leads, and the Invalidator carries a Reset.
func failover(t *testing.T, synchronous bool, cooldown time.Duration, retry string) failoverRun {
	t.Helper()
	ctx := t.Context()
	primary, standby := replicaPair(t)
	pp, sp := serverPool(t, primary.URL()), serverPool(t, standby.URL())
	if synchronous {
		makeSynchronous(t, pp)
	}
	if retry != "" {
		// How long the standby's startup process waits before it looks for
		// WAL again, and so, at worst, for the promotion request.
		if _, err := sp.Exec(ctx, "ALTER SYSTEM SET wal_retrieve_retry_interval = '"+retry+"'"); err != nil {
			t.Fatal(err)
		}
		if _, err := sp.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			t.Fatal(err)
		}
	}
	const schema = "failover"
	if err := pglimit.Migrate(ctx, pp, schema); err != nil {
		t.Fatal(err)
	}
	audit(t, pp, schema, pglimit.Upsert)
	caughtUp(t, pp, sp)

	pu, su := strings.TrimPrefix(primary.URL(), "postgres://postgres@"), strings.TrimPrefix(standby.URL(), "postgres://postgres@")
	hosts := strings.Split(pu, "/")[0] + "," + su
	pool := serverPool(t, "postgres://postgres@"+hosts+"&target_session_attrs=read-write&connect_timeout=1")
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Cooldown: cooldown, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Two instances' Cleaners, and an Invalidator, through the same hosts.
	var cleaners []*pglimitclean.Cleaner
	for range 2 {
		c, err := pglimitclean.New(pool, &pglimitclean.Config{Schema: schema, Interval: 100 * time.Millisecond, Retention: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Stop(context.Background()) })
		cleaners = append(cleaners, c)
	}
	oneLeader := func() bool { return cleaners[0].Stats().Leader != cleaners[1].Stats().Leader }
	waitFor(t, "one cleaner to lead", oneLeader)
	cc, err := pgx.ParseConfig(pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	inv, err := pglimit.NewInvalidator(&pglimit.InvalidatorConfig{ConnConfig: cc, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	startCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := inv.Start(startCtx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopInvalidator(t, inv) })

	var (
		mu   sync.Mutex
		run  failoverRun
		wg   sync.WaitGroup
		stop = make(chan struct{})
	)
	for w := range 8 {
		wg.Go(func() {
			var mine []seen
			for i := w; ; i += 7 {
				select {
				case <-stop:
					mu.Lock()
					run.calls = append(run.calls, mine...)
					mu.Unlock()
					return
				default:
				}
				c := seen{key: fmt.Sprintf("k%03d", i%200), sent: time.Now()}
				if i%2 == 1 {
					c.key = fmt.Sprintf("new-%d-%d", w, i)
				}
				d, err := lim.Allow(context.Background(), c.key)
				c.recv, c.allowed, c.err = time.Now(), d.Allowed, err
				mine = append(mine, c)
				if err != nil {
					time.Sleep(5 * time.Millisecond) // no busy loop while the pool has no server
				}
			}
		})
	}
	time.Sleep(time.Second)
	kill := time.Now()
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := sp.Exec(ctx, "SELECT pg_promote()"); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()

	errs := map[string]int{}
	var lastErr, longest time.Duration // after the kill
	after := 0                         // admissions sent once the standby was promoted
	for _, c := range run.calls {
		longest = max(longest, c.recv.Sub(c.sent))
		switch {
		case c.err != nil:
			errs[errKind(c.err)]++
			lastErr = max(lastErr, c.recv.Sub(kill))
		case c.allowed && c.sent.After(promoted):
			after++
		}
	}
	if after == 0 {
		t.Errorf("nothing admitted after the promotion; errors %v", errs)
	}
	waitFor(t, "one cleaner to lead on the new primary", oneLeader)
	for range 20 { // and never two, for a while (none, between two leaders, is no fault)
		if cleaners[0].Stats().Leader && cleaners[1].Stats().Leader {
			t.Error("both cleaners lead")
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	checkInvalidator(t, pool, schema, inv)
	run.record = auditRecord(t, sp, schema)
	t.Logf("synchronous %t: %d calls, errors %v, the last %s after the kill; promoted %s after it; %d admitted since; longest call %s",
		synchronous, len(run.calls), errs, lastErr.Round(time.Millisecond), promoted.Sub(kill).Round(time.Millisecond), after, longest.Round(time.Millisecond))
	return run
}

// checkInvalidator checks that inv carries Resets: a key pre-blocked by a
// limiter that follows inv is free there soon after another limiter's
// Reset.
func checkInvalidator(t *testing.T, pool *pgxpool.Pool, schema string, inv *pglimit.Invalidator) {
	t.Helper()
	waitFor(t, "the invalidator to listen again", inv.Listening)
	a, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Cooldown: time.Hour, PreBlockSize: 10, Invalidator: inv})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := b.Allow(t.Context(), "pre-blocked"); err != nil {
			t.Fatal(err)
		}
	}
	if !pglimit.PreBlocks(b, "pre-blocked") {
		t.Fatal("the key is not pre-blocked")
	}
	if err := a.Reset(t.Context(), "pre-blocked"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the Reset to reach the pre-block", func() bool { return !pglimit.PreBlocks(b, "pre-blocked") })
}

// errKind is the kind of a failover error, for the log.
func errKind(err error) string {
	switch {
	case errors.Is(err, pglimit.ErrTimeout):
		return "timeout"
	case errors.Is(err, pglimit.ErrReadOnly):
		return "read-only"
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return "connection"
}

// early counts, by key, the admissions of run that provably came less than
// cooldown after the key's previous one (the second answered less than
// cooldown after the first was sent), the admissions its callers saw that
// the new primary's record lacks (lost with the old primary), and the
// writes of that record less than cooldown after the key's previous one.
func (run failoverRun) early(cooldown time.Duration) (early, lost, inRecord map[string]int) {
	early, lost, inRecord = map[string]int{}, map[string]int{}, map[string]int{}
	last := map[string]int64{} // the record's latest expires_at of each key
	for _, r := range run.record {
		if prev, ok := last[r.key]; ok && r.expires-prev < cooldown.Microseconds() {
			inRecord[r.key]++
		}
		last[r.key] = r.expires
	}
	admitted := map[string][]seen{}
	for _, c := range run.calls {
		if c.err == nil && c.allowed {
			admitted[c.key] = append(admitted[c.key], c)
		}
	}
	recorded := map[string]int{}
	for _, r := range run.record {
		recorded[r.key]++
	}
	for key, adm := range admitted {
		slices.SortFunc(adm, func(a, b seen) int { return a.sent.Compare(b.sent) })
		for i := 1; i < len(adm); i++ {
			if adm[i].recv.Sub(adm[i-1].sent) < cooldown {
				early[key]++
			}
		}
		if n := len(adm) - recorded[key]; n > 0 {
			lost[key] = n
		}
	}
	return early, lost, inRecord
}

// A failover to a synchronous standby loses no admission the callers were
// told of: none is missing from the new primary's record, and no key is
// admitted again before its cooldown ends, by the callers' own clocks or
// by the record. The standby's wal_retrieve_retry_interval is 200 ms, as
// docs/operations.md advises.
func TestFailoverSync(t *testing.T) {
	testdb.Slow(t)
	t.Parallel()
	const cooldown = 500 * time.Millisecond
	run := failover(t, true, cooldown, "200ms")
	early, lost, inRecord := run.early(cooldown)
	if len(early) > 0 || len(lost) > 0 || len(inRecord) > 0 {
		t.Errorf("early re-admissions %v; admissions lost with the old primary %v; early in the record %v", early, lost, inRecord)
	}
}

// A failover to an asynchronous standby may lose admissions the callers
// were told of; each lets its key in once more, early, and nothing else
// does: every early re-admission is of a key whose admission was lost,
// at most one for each, and the new primary's record is consistent. The
// standby keeps PostgreSQL's defaults.
func TestFailoverAsync(t *testing.T) {
	testdb.Slow(t)
	t.Parallel()
	const cooldown = 500 * time.Millisecond
	run := failover(t, false, cooldown, "")
	early, lost, inRecord := run.early(cooldown)
	for key, n := range early {
		if n > lost[key] {
			t.Errorf("%s admitted early %d times, %d of its admissions lost", key, n, lost[key])
		}
	}
	if len(inRecord) > 0 {
		t.Errorf("the new primary's record admits keys early: %v", inRecord)
	}
	t.Logf("early re-admissions %v; admissions lost with the old primary %v", early, lost)
}

// A decision whose commit waits for a synchronous standby that does not
// answer fails with ErrTimeout once its Timeout has passed, and is no
// admission. PostgreSQL ends a cancelled wait for the standby by reporting
// the commit done, with a warning, though the standby may not have it: an
// admission told to its caller then could be lost by a failover.
func TestSyncWaitTimesOut(t *testing.T) {
	testdb.Slow(t)
	t.Parallel()
	ctx := t.Context()
	primary, standby := replicaPair(t)
	pp := serverPool(t, primary.URL())
	makeSynchronous(t, pp)
	const schema = "syncwait"
	if err := pglimit.Migrate(ctx, pp, schema); err != nil {
		t.Fatal(err)
	}
	lim, err := pglimit.New(pp, &pglimit.Config{Schema: schema, Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Allow(ctx, "answered"); err != nil || !d.Allowed {
		t.Fatalf("with the standby answering: %+v, %v", d, err)
	}
	if err := standby.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Thaw() })
	d, err := lim.Allow(ctx, "unanswered")
	switch {
	case err == nil:
		t.Errorf("admitted without the standby's acknowledgement: %+v", d)
	case !errors.Is(err, pglimit.ErrTimeout):
		t.Errorf("%v; want ErrTimeout", err)
	}
}
