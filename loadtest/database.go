package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
)

// database is the load test's own view of PostgreSQL, beside the pools under
// test: it creates one schema per strategy, empties them between runs, reads
// the server's counters and the admissions the database recorded.
type database struct {
	pool    *pgxpool.Pool
	version int    // server_version_num
	appName string // application_name of the pools under test
	schemas map[string]string
}

func openDatabase(ctx context.Context, url, appName string) (*database, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["application_name"] = appName + "-monitor"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	db := &database{pool: pool, appName: appName, schemas: map[string]string{}}
	if err := pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&db.version); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return db, nil
}

func (db *database) close() { db.pool.Close() }

// maxConns is how many connections one pool under test may open: the
// server's limit less a margin for superusers, this monitor and whatever
// else is connected.
func (db *database) maxConns(ctx context.Context) (int, error) {
	var limit, used int
	err := db.pool.QueryRow(ctx, `
SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')`).Scan(&limit, &used)
	if err != nil {
		return 0, err
	}
	return max(limit-used-4, 1), nil
}

// auditTable records every admission of the Upsert and NoWait tables, whose
// own rows keep only the latest. A trigger writes it, only on admission
// (refusals change no row), inside the admitting transaction: the row as
// written (expires_at, and the state of general limits), and two readings
// of the database clock that bracket the instant the admission was decided
// at: the start of its statement (statement_timestamp()) and the trigger's
// own clock_timestamp(), read after the row was written and before its lock
// is released. One write may admit several calls on the key at once (the
// library merges them): the expires_at it replaced (previous) tells how
// many for a single GCRA limit, the state it replaced (previous_state) for
// general limits.
const (
	auditTable   = "lt_admissions"
	auditTrigger = "lt_record_admission"
	auditSetup   = `
CREATE TABLE %[1]s.lt_admissions (key text NOT NULL, expires_at timestamptz NOT NULL, state bigint[],
    previous timestamptz, previous_state bigint[], statement_at timestamptz NOT NULL, recorded_at timestamptz NOT NULL);
CREATE FUNCTION %[1]s.lt_record_admission() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO %[1]s.lt_admissions (key, expires_at, state, previous, previous_state, statement_at, recorded_at)
    VALUES (NEW.key, NEW.expires_at, NEW.state, CASE TG_OP WHEN 'UPDATE' THEN OLD.expires_at END,
        CASE TG_OP WHEN 'UPDATE' THEN OLD.state END, statement_timestamp(), clock_timestamp());
    RETURN NULL;
END $$;
CREATE TRIGGER lt_record_admission AFTER INSERT OR UPDATE ON %[1]s.%[2]s
    FOR EACH ROW EXECUTE FUNCTION %[1]s.lt_record_admission();`
)

// setup creates a fresh schema (named after runID), migrated, for every
// variant with a table (the strategies and the write floor), with the audit
// trigger where a strategy's table keeps no history.
func (db *database) setup(ctx context.Context, runID string, vs []variant) error {
	for _, v := range vs {
		if _, done := db.schemas[v.Name]; done || v.Redis || v.Name == floorName {
			continue
		}
		schema := fmt.Sprintf("loadtest_%s_%s", runID, identPart(v.Name))
		if err := pglimit.Migrate(ctx, db.pool, schema); err != nil {
			return fmt.Errorf("migrate %s: %w", schema, err)
		}
		db.schemas[v.Name] = schema
		if v.Strategy == pglimit.Range || v.Floor {
			continue
		}
		if _, err := db.pool.Exec(ctx, fmt.Sprintf(auditSetup, ident(schema), ident(tableOf(v)))); err != nil {
			return fmt.Errorf("audit trigger in %s: %w", schema, err)
		}
	}
	return nil
}

// identPart turns a variant name into identifier characters.
func identPart(name string) string {
	b := []byte(name)
	for i, c := range b {
		if c == '-' {
			b[i] = '_'
		}
	}
	return string(b)
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

func tableOf(v variant) string { return cmp.Or(v.Table, "pglimit_"+string(v.Strategy)) }

// dropSchemas removes what setup created.
func (db *database) dropSchemas(ctx context.Context) error {
	var errs []error
	for _, s := range db.schemas {
		if _, err := db.pool.Exec(ctx, "DROP SCHEMA "+ident(s)+" CASCADE"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// prepare empties v's tables and switches its audit trigger on or off, or
// for the write floor fills its table with seed, then checkpoints, so that
// every run starts from the same state: the same table and the first write
// to each page paying for a full-page image.
func (db *database) prepare(ctx context.Context, v variant, audit bool, seed []string) error {
	if schema, ok := db.schemas[v.Name]; ok {
		table := ident(schema) + "." + ident(tableOf(v))
		type stmt struct {
			sql  string
			args []any
		}
		stmts := []stmt{{sql: "TRUNCATE " + table}}
		switch {
		case v == writeFloor:
			stmts = append(stmts, stmt{"INSERT INTO " + table + " (namespace, key, expires_at) SELECT $1, k, now() FROM unnest($2::text[]) AS k",
				[]any{namespace, seed}})
		case v.Strategy != pglimit.Range:
			stmts[0].sql += ", " + ident(schema) + "." + auditTable
			state := "DISABLE"
			if audit {
				state = "ENABLE"
			}
			stmts = append(stmts, stmt{sql: fmt.Sprintf("ALTER TABLE %s %s TRIGGER %s", table, state, auditTrigger)})
		}
		for _, s := range stmts {
			if _, err := db.pool.Exec(ctx, s.sql, s.args...); err != nil {
				return fmt.Errorf("prepare %s: %w", v.Name, err)
			}
		}
	}
	// Not fatal: a role without pg_checkpoint just gets noisier WAL figures.
	_, _ = db.pool.Exec(ctx, "CHECKPOINT")
	return nil
}

// record returns the admissions the database holds for v, by key: the
// Range table's own rows, or the audit table. ok is false where there is
// no record (the audit trigger was off, or v is a floor or the peer).
func (db *database) record(ctx context.Context, v variant, audit bool) (byKey map[string][]time.Time, ok bool, err error) {
	schema, found := db.schemas[v.Name]
	if !found || v.Floor || (!audit && v.Strategy != pglimit.Range) {
		return nil, false, nil
	}
	q := "SELECT key, expires_at FROM " + ident(schema) + "." + auditTable
	if v.Strategy == pglimit.Range {
		q = "SELECT key, upper(during) FROM " + ident(schema) + "." + ident(tableOf(v))
	}
	rows, err := db.pool.Query(ctx, q)
	if err != nil {
		return nil, false, err
	}
	byKey = map[string][]time.Time{}
	var (
		key string
		at  time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &at}, func() error {
		byKey[key] = append(byKey[key], at)
		return nil
	})
	return byKey, err == nil, err
}

// auditRow is one admission of a general limit as the audit trigger
// recorded it, times in microseconds since the epoch on the database clock:
// it was decided at some instant in [stmt, at].
type auditRow struct {
	stmt, at int64
	state    []int64 // the row's state after it; nil for a single GCRA limit
}

// recordLimits returns, by key, the admissions the audit trigger recorded
// in v's table, for its limits, each call of one unit: a write counts as
// many admissions as units it admitted. For a single GCRA limit, a write
// that moved its TAT by k emission intervals past max(previous TAT, the
// time of the decision) admitted k; for general limits, the first window's
// count grew by them (or, with GCRA limits only, the first one's TAT moved
// by them).
func (db *database) recordLimits(ctx context.Context, v variant, limits []pglimit.Limit) (map[string][]auditRow, error) {
	rows, err := db.pool.Query(ctx, `
SELECT key, state, previous_state, (extract(epoch FROM expires_at) * 1000000)::bigint, (extract(epoch FROM previous) * 1000000)::bigint,
    (extract(epoch FROM statement_at) * 1000000)::bigint, (extract(epoch FROM recorded_at) * 1000000)::bigint
FROM `+ident(db.schemas[v.Name])+"."+auditTable)
	if err != nil {
		return nil, err
	}
	byKey := map[string][]auditRow{}
	var (
		key      string
		r        auditRow
		was      []int64
		expires  int64
		previous *int64
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &r.state, &was, &expires, &previous, &r.stmt, &r.at}, func() error {
		calls := max(unitsWritten(limits, r, was, expires, previous), 1)
		for range calls {
			byKey[key] = append(byKey[key], r)
		}
		r.state, was, previous = nil, nil, nil
		return nil
	})
	return byKey, err
}

// unitsWritten is how many units the write r of limits admitted, from the
// state (or, for a single GCRA limit, the TAT) it replaced, was (previous),
// and the one it wrote. A GCRA limit's TAT moved from max(previous TAT, the
// time of the decision) by its units' emission intervals; the decision's
// time is taken to be the trigger's, well within an interval (the count
// rounds).
func unitsWritten(limits []pglimit.Limit, r auditRow, was []int64, expires int64, previous *int64) int {
	gcra := func(l pglimit.Limit, prev *int64, tat int64) int {
		t := emission(l).Microseconds()
		base := r.at
		if prev != nil {
			base = max(base, *prev)
		}
		return int((tat - base + t/2) / t)
	}
	if len(limits) == 1 && limits[0].Algorithm == pglimit.GCRA {
		return gcra(limits[0], previous, expires)
	}
	if len(r.state) != 3*len(limits) {
		return 0
	}
	if len(was) != len(r.state) {
		was = nil // a new key, or state of other limits: nothing before
	}
	for i, l := range limits {
		s := r.state[3*i : 3*i+3]
		var p []int64
		if was != nil {
			p = was[3*i : 3*i+3]
		}
		switch {
		case l.Algorithm == pglimit.FixedWindow && p != nil && p[0] == s[0]:
			return int(s[1] - p[1])
		case l.Algorithm == pglimit.FixedWindow:
			return int(s[1])
		case l.Algorithm == pglimit.SlidingWindow && p != nil && p[0] == s[0]:
			return int(s[2] - p[2])
		case l.Algorithm == pglimit.SlidingWindow:
			return int(s[2])
		}
	}
	var prev *int64
	if was != nil {
		prev = &was[0]
	}
	return gcra(limits[0], prev, r.state[0])
}

// leaseWrite is one write of a single GCRA limit's row as the audit trigger
// recorded it, in µs since the epoch on the database clock: the TAT it
// replaced (none for a new key) and the one it wrote, between its
// statement's start and the trigger's clock.
type leaseWrite struct {
	previous *int64
	expires  int64
	stmt, at int64
}

// recordWrites returns, by key, the writes the audit trigger recorded in
// v's table, in the order they were made: for a limit that leases, whose
// writes take units for later, not admissions (docs/limits.md, "Leases").
func (db *database) recordWrites(ctx context.Context, v variant) (map[string][]leaseWrite, error) {
	rows, err := db.pool.Query(ctx, `
SELECT key, (extract(epoch FROM previous) * 1000000)::bigint, (extract(epoch FROM expires_at) * 1000000)::bigint,
    (extract(epoch FROM statement_at) * 1000000)::bigint, (extract(epoch FROM recorded_at) * 1000000)::bigint
FROM `+ident(db.schemas[v.Name])+"."+auditTable+` ORDER BY recorded_at`)
	if err != nil {
		return nil, err
	}
	byKey := map[string][]leaseWrite{}
	var (
		key string
		w   leaseWrite
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &w.previous, &w.expires, &w.stmt, &w.at}, func() error {
		byKey[key] = append(byKey[key], w)
		w.previous = nil
		return nil
	})
	return byKey, err
}

// now reads the database clock, the one the limiter decides by.
func (db *database) now(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := db.pool.QueryRow(ctx, "SELECT statement_timestamp()").Scan(&t)
	return t, err
}

// lockWaiters counts the client backends of the database waiting on a
// lock (a row, a transaction, a tuple) right now, ours excepted.
func (db *database) lockWaiters(ctx context.Context) (int, error) {
	var n int
	err := db.pool.QueryRow(ctx, `
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&n)
	return n, err
}

// dbStats are server counters; a run reports the difference across it.
type dbStats struct {
	Commits    int64 `json:"commits"`
	Rollbacks  int64 `json:"rollbacks"`
	Deadlocks  int64 `json:"deadlocks"`
	WALBytes   int64 `json:"wal_bytes"`
	WALRecords int64 `json:"wal_records"` // PostgreSQL 14+
	WALSyncs   int64 `json:"wal_syncs"`   // PostgreSQL 14-17
}

func (a dbStats) sub(b dbStats) dbStats {
	return dbStats{
		Commits:    a.Commits - b.Commits,
		Rollbacks:  a.Rollbacks - b.Rollbacks,
		Deadlocks:  a.Deadlocks - b.Deadlocks,
		WALBytes:   a.WALBytes - b.WALBytes,
		WALRecords: a.WALRecords - b.WALRecords,
		WALSyncs:   a.WALSyncs - b.WALSyncs,
	}
}

// snapshot reads the counters in one statement. WAL bytes come from the
// WAL position, exact and immediate; the rest from the cumulative
// statistics, which a backend publishes when it exits or within about a
// second of going idle (see settle).
func (db *database) snapshot(ctx context.Context) (dbStats, error) {
	walStats := "NULL::jsonb"
	if db.version >= 140000 {
		walStats = "(SELECT to_jsonb(w) FROM pg_stat_wal AS w)"
	}
	var (
		s   dbStats
		wal []byte
	)
	err := db.pool.QueryRow(ctx, `
SELECT d.xact_commit, d.xact_rollback, d.deadlocks,
       pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, `+walStats+`
FROM pg_stat_database AS d
WHERE d.datname = current_database()`).Scan(&s.Commits, &s.Rollbacks, &s.Deadlocks, &s.WALBytes, &wal)
	if err != nil {
		return dbStats{}, fmt.Errorf("read statistics: %w", err)
	}
	if wal != nil {
		var w struct {
			Records *int64 `json:"wal_records"`
			Sync    *int64 `json:"wal_sync"`
		}
		if err := json.Unmarshal(wal, &w); err == nil {
			if w.Records != nil {
				s.WALRecords = *w.Records
			}
			if w.Sync != nil {
				s.WALSyncs = *w.Sync
			}
		}
	}
	return s, nil
}

// settle waits until the statistics of a finished run are published. The
// pools under test are closed by then: their backends flush their counters
// as they exit, before they leave pg_stat_activity. Over HTTP the demo's
// backends stay connected and flush within about a second of going idle.
func (db *database) settle(ctx context.Context, ownPools bool) error {
	if !ownPools {
		return sleep(ctx, 1500*time.Millisecond)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		err := db.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", db.appName).Scan(&n)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d connections of the run still open after 10s", n)
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// settings returns the server facts a reader needs to judge the figures.
func (db *database) settings(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	rows, err := db.pool.Query(ctx, `
SELECT name, current_setting(name) FROM pg_settings
WHERE name IN ('server_version', 'synchronous_commit', 'fsync', 'full_page_writes', 'wal_level',
               'shared_buffers', 'max_connections', 'deadlock_timeout', 'wal_sync_method', 'commit_delay')`)
	if err != nil {
		return nil, err
	}
	var name, value string
	_, err = pgx.ForEachRow(rows, []any{&name, &value}, func() error {
		out[name] = value
		return nil
	})
	return out, err
}
