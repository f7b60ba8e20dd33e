package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
)

var databaseSeq atomic.Int64

// newDatabase creates an empty database on the shared server, dropped when
// the test ends, and returns a connection config for it. Unlike the shared
// database it has no btree_gist yet, so Migrate has to create it.
func newDatabase(t *testing.T) *pgxpool.Config {
	t.Helper()
	ctx := context.Background()
	admin := testdb.Pool(t)
	name := fmt.Sprintf("pglimit_db_%d_%d", time.Now().UnixNano(), databaseSeq.Add(1))
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Database = name
	cfg.MaxConns = 2
	return cfg
}

// openPool opens a pool of cfg, closed when the test ends.
func openPool(t *testing.T, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// rangeHolds reports whether the Range limiter of schema refuses a second
// request for a key inside its cooldown.
func rangeHolds(t *testing.T, pool *pgxpool.Pool, schema, key string) bool {
	t.Helper()
	lim, err := pglimit.New(pool, &pglimit.Config{Strategy: pglimit.Range, Schema: schema, Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for range 2 {
		d, err := lim.Allow(context.Background(), key)
		if err != nil {
			t.Logf("Range in %s: %v", schema, err)
			return false
		}
		if d.Allowed {
			admitted++
		}
	}
	return admitted == 1
}

func extensionSchema(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var schema string
	err := pool.QueryRow(context.Background(), `
SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
WHERE e.extname = 'btree_gist'`).Scan(&schema)
	if err != nil {
		t.Fatalf("btree_gist: %v", err)
	}
	return schema
}

// Dropping the schema migrated first must not drop btree_gist, and with it
// the exclusion constraint of every other schema's Range table.
func TestDroppingASchemaKeepsOtherRangeLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := openPool(t, newDatabase(t))
	for _, s := range []string{"tenant_a", "tenant_b"} {
		if err := pglimit.Migrate(ctx, pool, s); err != nil {
			t.Fatalf("Migrate %s: %v", s, err)
		}
	}
	if got := extensionSchema(t, pool); got != "pglimit_ext" {
		t.Errorf("btree_gist is in schema %s, want %s", got, "pglimit_ext")
	}
	if _, err := pool.Exec(ctx, "DROP SCHEMA tenant_a CASCADE"); err != nil {
		t.Fatal(err)
	}
	if !rangeHolds(t, pool, "tenant_b", "k") {
		t.Fatal("after DROP SCHEMA tenant_a CASCADE, the Range limiter of tenant_b admits a key twice within its cooldown")
	}
}

// The extension is found where it is, and the reserved schema cannot be a
// tenant, which could then drop it.
func TestMigrateUsesExistingExtension(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := openPool(t, newDatabase(t))
	if _, err := pool.Exec(ctx, "CREATE SCHEMA shared; CREATE EXTENSION btree_gist SCHEMA shared"); err != nil {
		t.Fatal(err)
	}
	if err := pglimit.Migrate(ctx, pool, "tenant"); err != nil {
		t.Fatal(err)
	}
	if got := extensionSchema(t, pool); got != "shared" {
		t.Errorf("btree_gist moved to %s", got)
	}
	if !rangeHolds(t, pool, "tenant", "k") {
		t.Error("Range admits twice within its cooldown")
	}
	if err := pglimit.Migrate(ctx, pool, "pglimit_ext"); !errors.Is(err, pglimit.ErrInvalidConfig) {
		t.Errorf("Migrate(%s) = %v, want ErrInvalidConfig", "pglimit_ext", err)
	}
}

// A schema goose calls migrated can still lose its Range constraint
// (DROP EXTENSION ... CASCADE, or a schema holding the extension dropped
// under an older version). Migrate puts it back, keeping the earliest of
// overlapping rows written meanwhile.
func TestMigrateRepairsRangeConstraint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := openPool(t, newDatabase(t))
	const schema = "tenant"
	if err := pglimit.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "DROP EXTENSION btree_gist CASCADE"); err != nil {
		t.Fatal(err)
	}
	// Admissions made while the table had no constraint: two overlapping
	// ones on key "k", one on "other".
	if _, err := pool.Exec(ctx, `
INSERT INTO tenant.pglimit_range (namespace, key, during) VALUES
    ('default', 'k', tstzrange(now() - interval '1 minute', now() + interval '1 hour')),
    ('default', 'k', tstzrange(now(), now() + interval '1 hour')),
    ('default', 'other', tstzrange(now(), now() + interval '1 hour'))`); err != nil {
		t.Fatal(err)
	}

	if err := pglimit.Migrate(ctx, pool, schema); err != nil {
		t.Fatalf("Migrate on a schema that lost its constraint: %v", err)
	}
	var constraints int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint
WHERE conrelid = 'tenant.pglimit_range'::regclass AND conname = 'pglimit_range_no_overlap'`).Scan(&constraints); err != nil {
		t.Fatal(err)
	}
	if constraints != 1 {
		t.Fatalf("after Migrate, pglimit_range_no_overlap exists %d times, want once", constraints)
	}
	var kept []time.Time
	rows, _ := pool.Query(ctx, "SELECT lower(during) FROM tenant.pglimit_range WHERE key = 'k'")
	kept, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		t.Fatal(err)
	}
	var now time.Time
	if err := pool.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	if len(kept) != 1 || now.Sub(kept[0]) < 30*time.Second {
		t.Errorf("rows of key k after the repair start at %v (now %v), want only the earliest", kept, now)
	}
	if !rangeHolds(t, pool, schema, "new") {
		t.Error("Range admits twice within its cooldown after the repair")
	}
}

// "Safe to run from every instance at start-up": n instances, each with its
// own pool, start at once on a new database, all on one schema or each on
// its own. (The race on one schema is narrow here; the next test makes it
// certain.) Not parallel with other tests: it needs many connections.
func TestMigrateConcurrentFirstRuns(t *testing.T) {
	testdb.Slow(t)
	const n = 80
	for _, tc := range []struct {
		name   string
		schema func(i int) string
	}{
		{"same schema", func(int) string { return "tenant" }},
		{"different schemas", func(i int) string { return fmt.Sprintf("tenant_%d", i) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := newDatabase(t)
			cfg.MaxConns = 1
			pools := make([]*pgxpool.Pool, n)
			for i := range pools {
				pools[i] = openPool(t, cfg)
				if err := pools[i].Ping(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			errs := make([]error, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-start
					errs[i] = pglimit.Migrate(ctx, pools[i], tc.schema(i))
				})
			}
			close(start)
			wg.Wait()
			failed := 0
			for i, err := range errs {
				if err != nil {
					failed++
					t.Errorf("instance %d: %v", i, err)
				}
			}
			if failed > 0 {
				t.Fatalf("%d of %d concurrent first Migrate calls failed", failed, n)
			}
			for i := range n {
				if s := tc.schema(i); !rangeHolds(t, pools[i], s, fmt.Sprintf("k%d", i)) {
					t.Errorf("schema %s: Range admits twice within its cooldown", s)
				}
			}
		})
	}
}

// The race on one schema, made certain: the schema, or the extension, is
// being created by a transaction outside Migrate (another instance of an
// older version, a DBA, the goose CLI) when n instances start. Each must
// wait for it and go on once it commits, not fail with 23505.
func TestMigrateWhileCreatedElsewhere(t *testing.T) {
	for _, tc := range []struct{ name, create string }{
		{"schema", "CREATE SCHEMA tenant"},
		{"extension", "CREATE EXTENSION btree_gist SCHEMA public"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const n = 8
			ctx := context.Background()
			cfg := newDatabase(t)
			admin := openPool(t, cfg)
			other, err := admin.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = other.Rollback(ctx) }()
			if _, err := other.Exec(ctx, tc.create); err != nil {
				t.Fatal(err)
			}

			errs := make(chan error, n)
			for range n {
				pool := openPool(t, cfg)
				go func() { errs <- pglimit.Migrate(ctx, pool, "tenant") }()
			}
			// Commit once a Migrate waits for the uncommitted row.
			deadline := time.Now().Add(30 * time.Second)
			for waiting := 0; waiting == 0; {
				if time.Now().After(deadline) {
					t.Fatal("no Migrate waits for the uncommitted " + tc.name)
				}
				time.Sleep(10 * time.Millisecond) // the server has no event to wait on
				if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'transactionid'`).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
			}
			if err := other.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			failed := 0
			for range n {
				if err := <-errs; err != nil {
					failed++
					t.Error(err)
				}
			}
			if failed > 0 {
				t.Fatalf("%d of %d Migrate calls failed while the %s was being created elsewhere", failed, n, tc.name)
			}
			if !rangeHolds(t, admin, "tenant", "k") {
				t.Error("Range admits twice within its cooldown")
			}
		})
	}
}

// Least-privileged roles: one that may create schemas in the database (and
// so the trusted extension) gets btree_gist in pglimit_ext; one that may
// not, given its schema and the extension by an administrator, migrates
// without needing more.
func TestMigrateLeastPrivilegedRoles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		admin   func(role string) []string // run by the superuser in the new database
		wantExt string
	}{
		{"create on the database", func(role string) []string {
			return []string{"GRANT CREATE ON DATABASE %s TO " + role}
		}, "pglimit_ext"},
		{"own schema only, extension installed", func(role string) []string {
			return []string{"CREATE EXTENSION btree_gist SCHEMA public", "CREATE SCHEMA tenant AUTHORIZATION " + role}
		}, "public"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			super := testdb.Pool(t)
			role := fmt.Sprintf("pglimit_role_%d_%d", time.Now().UnixNano(), databaseSeq.Add(1))
			if _, err := super.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { // after the database is dropped
				if _, err := super.Exec(context.Background(), "DROP ROLE IF EXISTS "+role); err != nil {
					t.Errorf("drop role: %v", err)
				}
			})
			cfg := newDatabase(t)
			admin := openPool(t, cfg)
			for _, q := range tc.admin(role) {
				if strings.Contains(q, "%s") {
					q = fmt.Sprintf(q, cfg.ConnConfig.Database)
				}
				if _, err := admin.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			cfg.ConnConfig.User = role
			pool := openPool(t, cfg)
			if err := pglimit.Migrate(ctx, pool, "tenant"); err != nil {
				t.Fatalf("Migrate as %s: %v", tc.name, err)
			}
			if got := extensionSchema(t, pool); got != tc.wantExt {
				t.Errorf("btree_gist in %s, want %s", got, tc.wantExt)
			}
			if !rangeHolds(t, pool, "tenant", "k") {
				t.Error("Range admits twice within its cooldown")
			}
		})
	}
}

// The least-privileged set-up of docs/operations.md, in a database without
// btree_gist: an owner role with every privilege on the schema public and
// none on the database migrates; a runtime role with the table privileges
// decides on Upsert and NoWait, and its Range limiter refuses with
// ErrExtension, which names the fix; a cleanup role with SELECT, UPDATE (to
// lock rows) and DELETE cleans. Once an administrator installs the
// extension, the owner's next Migrate gives the Range table its constraint.
func TestLeastPrivilegedRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	super := testdb.Pool(t)
	suffix := fmt.Sprintf("%d_%d", time.Now().UnixNano(), databaseSeq.Add(1))
	owner, app, cleaner := "pglimit_owner_"+suffix, "pglimit_app_"+suffix, "pglimit_clean_"+suffix
	for _, role := range []string{owner, app, cleaner} {
		// A password, for servers that ask for one (a container's do).
		if _, err := super.Exec(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD 'pglimit'"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // after the database is dropped
			if _, err := super.Exec(context.Background(), "DROP ROLE IF EXISTS "+role); err != nil {
				t.Errorf("drop role: %v", err)
			}
		})
	}
	cfg := newDatabase(t)
	admin := openPool(t, cfg)
	exec := func(pool *pgxpool.Pool, qs ...string) {
		t.Helper()
		for _, q := range qs {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	exec(admin, "GRANT ALL ON SCHEMA public TO "+owner, "GRANT USAGE ON SCHEMA public TO "+app+", "+cleaner)
	as := func(role string) *pgxpool.Pool {
		c := cfg.Copy()
		c.ConnConfig.User, c.ConnConfig.Password = role, "pglimit"
		return openPool(t, c)
	}
	ownerPool, appPool, cleanerPool := as(owner), as(app), as(cleaner)

	if err := pglimit.Migrate(ctx, ownerPool, "public"); err != nil {
		t.Fatalf("Migrate as a role without CREATE on the database: %v", err)
	}
	exec(ownerPool,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "+app,
		"GRANT SELECT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "+cleaner)

	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		for _, cfg := range []*pglimit.Config{
			{Strategy: s, Cooldown: time.Hour},
			{Strategy: s, Limits: []pglimit.Limit{
				{Name: "rate", Rate: 1, Period: time.Hour},
				{Name: "daily", Rate: 5, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
			}, Namespace: "tiers", Overrides: true},
		} {
			lim, err := pglimit.New(appPool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			key := fmt.Sprintf("%s-%d", s, len(cfg.Limits))
			first, err1 := lim.Allow(ctx, key)
			second, err2 := lim.Allow(ctx, key)
			if err1 != nil || err2 != nil || !first.Allowed || second.Allowed {
				t.Fatalf("%s with %d limits as the runtime role: %+v, %v then %+v, %v; want admitted then refused",
					s, len(cfg.Limits), first, err1, second, err2)
			}
			if ok, err := lim.Refund(ctx, first, 1); err != nil || !ok {
				t.Fatalf("%s: Refund as the runtime role: %t, %v", s, ok, err)
			}
			if err := lim.Reset(ctx, key); err != nil {
				t.Fatalf("%s: Reset as the runtime role: %v", s, err)
			}
			if cfg.Overrides {
				raised := []pglimit.Limit{{Name: "rate", Rate: 2}}
				if err := pglimit.SetKeyLimits(ctx, lim, key, raised...); err != nil {
					t.Fatalf("%s: SetKeyLimits as the runtime role: %v", s, err)
				}
				if _, err := pglimit.ListKeyLimits(ctx, lim, "", 10); err != nil {
					t.Fatalf("%s: ListKeyLimits as the runtime role: %v", s, err)
				}
			}
			// What the person on call reads (cmd/pglimit).
			if _, err := pglimit.Inspect(ctx, lim, key); err != nil {
				t.Fatalf("%s: Inspect as the runtime role: %v", s, err)
			}
			if _, err := pglimit.LimitedKeys(ctx, lim, 1, "", 10); err != nil {
				t.Fatalf("%s: LimitedKeys as the runtime role: %v", s, err)
			}
		}
	}
	lim, err := pglimit.New(appPool, &pglimit.Config{Strategy: pglimit.Range, Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	d, err := lim.Allow(ctx, "k")
	if !errors.Is(err, pglimit.ErrNoExclusionConstraint) || !errors.Is(err, pglimit.ErrExtension) ||
		!strings.Contains(err.Error(), "CREATE EXTENSION btree_gist") || d.Allowed {
		t.Fatalf("Range without btree_gist: %+v, %v; want refused with ErrNoExclusionConstraint and ErrExtension naming the fix", d, err)
	}

	if st, err := pglimitclean.Inspect(ctx, appPool, &pglimitclean.Config{Tables: []string{"pglimit_upsert", "pglimit_nowait"}}); err != nil || len(st.Tables) != 2 {
		t.Fatalf("Inspect of the cleaner as the runtime role: %+v, %v", st, err)
	}

	// The cleanup role deletes what has expired.
	exec(admin, "INSERT INTO pglimit_upsert (namespace, key, expires_at) VALUES ('old', 'k', now() - interval '1 hour')")
	runs := make(chan pglimitclean.Observation, 1)
	cleanCfg := &pglimitclean.Config{Tables: []string{"pglimit_upsert"}, Interval: 20 * time.Millisecond, Retention: time.Nanosecond, Observer: cleanupRuns(runs)}
	c, err := pglimitclean.New(cleanerPool, cleanCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case run := <-runs:
		if run.Err != nil || run.Rows != 1 {
			t.Fatalf("cleanup as the cleanup role: %d rows deleted, %v; want the old row", run.Rows, run.Err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no cleanup run as the cleanup role within 30s")
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	// An administrator installs the extension; the owner migrates again.
	exec(admin, "CREATE SCHEMA pglimit_ext", "CREATE EXTENSION btree_gist SCHEMA pglimit_ext")
	if err := pglimit.Migrate(ctx, ownerPool, "public"); err != nil {
		t.Fatalf("Migrate once the extension is installed: %v", err)
	}
	if !rangeHolds(t, appPool, "public", "k") {
		t.Error("Range after the extension and Migrate: want one admission within the cooldown")
	}
}

// cleanupRuns is a cleaner's Observer that sends each run to a channel,
// dropping those it has no room for.
type cleanupRuns chan<- pglimitclean.Observation

func (r cleanupRuns) ObserveCleanup(_ context.Context, o pglimitclean.Observation) {
	select {
	case r <- o:
	default:
	}
}
