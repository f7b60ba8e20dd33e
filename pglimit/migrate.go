package pglimit

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/pglimit/cooldown/migrations"
	"github.com/pglimit/cooldown/pglimit/internal/fault"
	"github.com/pglimit/cooldown/pglimit/internal/lockid"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// migrationsTable is the goose version table pglimit keeps in the schema it
// migrates. It differs from goose's default so that an application that
// runs its own goose migrations in the same schema never collides with ours.
const migrationsTable = "pglimit_goose_db_version"

// extensionSchema is the schema in which [Migrate] creates btree_gist when
// the database does not have it yet. A schema of its own, because a
// database holds an extension once, in one schema, and dropping that schema
// drops the extension and with it the exclusion constraint of every Range
// table in the database: dropping a tenant's schema must not do that.
// Migrate refuses to migrate it. Where btree_gist already exists, in any
// schema, Migrate uses it where it is.
const extensionSchema = fault.ExtensionSchema

// The Range table and the exclusion constraint migration 00002 gives it;
// without the constraint the table admits everything.
const (
	rangeTable      = "pglimit_range"
	rangeConstraint = "pglimit_range_no_overlap"
)

// Migrate creates or upgrades pglimit's tables in schema ("" means
// "public"), creating the schema, and btree_gist in pglimit_ext, if
// needed. A role that may not create btree_gist (it lacks CREATE on the
// database) still migrates with privileges on its schema alone: only the
// Range strategy needs the extension, and it refuses to decide, with
// [ErrExtension], until someone who may installs it and Migrate runs again.
// It is safe to run from every instance at start-up, on one schema
// or many: creating schemas and the extension, which belong to the whole
// database, is serialized by one advisory lock per database, and the
// migrations of a schema by one per schema.
//
// It also repairs what a migrated schema can lose without goose noticing:
// if the Range table's exclusion constraint is missing (dropping btree_gist
// drops it, and a table migrated without the extension never had it),
// Migrate recreates the extension, if it may, and the constraint, first
// deleting the rows that overlap an earlier row of their key, which the
// table admitted while it had no constraint.
//
// It dials its own connections from pool's configuration, so the pool's
// connections never see the search_path it sets. On a server that cannot
// write (a standby), it fails with [ErrReadOnly] and changes nothing,
// whether the schema is migrated there or not.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	schema = cmp.Or(schema, defaultSchema)
	if err := ValidateIdentifier(schema); err != nil {
		return fmt.Errorf("%w: schema: %w", ErrInvalidConfig, err)
	}
	if schema == extensionSchema {
		return fmt.Errorf("%w: schema: %s is reserved for the btree_gist extension", ErrInvalidConfig, extensionSchema)
	}
	connCfg := pool.Config().ConnConfig.Copy()
	connCfg.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	if err := prepareDatabase(ctx, connCfg, schema); err != nil {
		return err
	}

	db := stdlib.OpenDB(*connCfg)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithDisableGlobalRegistry(true),
		goose.WithTableName(migrationsTable),
		goose.WithSessionLocker(sessionLocker{id: lockid.Migration(schema)}),
	)
	if err != nil {
		return fmt.Errorf("pglimit: migrate: %w", err)
	}
	// Without pending migrations, as at every start but the first, each
	// instance goes on at once instead of queueing for the schema's lock.
	pending, err := provider.HasPending(ctx)
	if err != nil {
		return fmt.Errorf("pglimit: migrate: %w", err)
	}
	if !pending {
		return nil
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("pglimit: migrate: %w", err)
	}
	return nil
}

// prepareDatabase creates schema and btree_gist if missing, and repairs a
// Range table that lost its constraint, under the database's setup lock:
// the extension is one per database, so a lock per schema would let two
// first runs on different schemas both create it (23505), and
// CREATE SCHEMA IF NOT EXISTS races the same way on one schema.
//
// The lock is held on a connection of its own, closed before goose runs:
// migration 00003 builds indexes CONCURRENTLY, which waits for every
// transaction in the database, so no Migrate may hold this lock meanwhile.
func prepareDatabase(ctx context.Context, connCfg *pgx.ConnConfig, schema string) error {
	conn, err := pgx.ConnectConfig(ctx, connCfg)
	if err != nil {
		if fault.IsReadOnly(err) {
			return fmt.Errorf("%w: migrate: %w", ErrReadOnly, err)
		}
		return fmt.Errorf("pglimit: migrate: %w", err)
	}
	// Closing the session releases the lock.
	defer conn.Close(context.Background())
	var ro bool
	if err := conn.QueryRow(ctx, queries.Static("migrate.read_only")).Scan(&ro); err != nil {
		return fmt.Errorf("pglimit: migrate: %w", err)
	}
	if ro {
		return fmt.Errorf("%w: migrate", ErrReadOnly)
	}
	err = pollLock(ctx, func() (got bool, err error) {
		err = conn.QueryRow(ctx, queries.Static("advisory.try_lock"), lockid.Setup).Scan(&got)
		return got, err
	})
	if err != nil {
		return fmt.Errorf("pglimit: migrate: setup lock: %w", err)
	}
	if err := createSchema(ctx, conn, schema); err != nil {
		return fmt.Errorf("pglimit: migrate: create schema %s: %w", schema, err)
	}
	if err := createExtension(ctx, conn); err != nil && !outOfReach(err) {
		return fmt.Errorf("%w: %w", ErrExtension, err)
	}
	if err := repairRange(ctx, conn, schema); err != nil {
		return fmt.Errorf("pglimit: migrate: repair %s.%s: %w", schema, rangeConstraint, err)
	}
	return nil
}

// createSchema creates schema unless it exists. CREATE SCHEMA IF NOT EXISTS
// alone needs CREATE on the database even when the schema exists; a
// least-privileged role given an existing schema may lack it.
func createSchema(ctx context.Context, conn *pgx.Conn, schema string) error {
	var exists bool
	if err := conn.QueryRow(ctx, queries.Static("migrate.schema_exists"), schema).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err := conn.Exec(ctx, queries.Text("migrate.create_schema", queries.Args{"schema": pgx.Identifier{schema}.Sanitize()}))
	return createdElsewhere(err)
}

// createdElsewhere forgives the error of CREATE ... IF NOT EXISTS racing a
// creator outside Migrate's lock (an older version, the goose CLI, a DBA):
// it waits for that transaction and, once it commits, fails with 23505,
// which then means the object exists.
func createdElsewhere(err error) error {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "23505" {
		return nil
	}
	return err
}

// createExtension creates btree_gist in extensionSchema unless the database
// has it in some schema already. Its operator classes need not be on the
// search_path: a gist index on text finds the default operator class
// wherever it lives.
func createExtension(ctx context.Context, conn *pgx.Conn) error {
	var exists bool
	if err := conn.QueryRow(ctx, queries.Static("migrate.has_btree_gist")).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	if err := createSchema(ctx, conn, extensionSchema); err != nil {
		return err
	}
	_, err := conn.Exec(ctx, queries.Text("migrate.create_btree_gist", queries.Args{"schema": pgx.Identifier{extensionSchema}.Sanitize()}))
	return createdElsewhere(err)
}

// outOfReach reports an extension that this role may not create (42501),
// or that the server does not have (58P01, 0A000): the schema migrates
// without it, and Range waits for it.
func outOfReach(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && (pgErr.Code == "42501" || pgErr.Code == "58P01" || pgErr.Code == "0A000")
}

// repairRange gives a Range table that exists without its exclusion
// constraint the constraint back, once the database has btree_gist. The rows it admitted meanwhile may
// overlap; of two overlapping rows of one key the later one goes, so the
// cooldown that began first stays in force. The table is locked against
// writers throughout, so no overlap can slip in between.
func repairRange(ctx context.Context, conn *pgx.Conn, schema string) error {
	table := pgx.Identifier{schema, rangeTable}.Sanitize()
	var missing, extension bool
	err := conn.QueryRow(ctx, queries.Static("migrate.range_unconstrained"), table, rangeConstraint).Scan(&missing, &extension)
	if err != nil || !missing || !extension {
		return err
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		args := queries.Args{"table": table, "constraint": pgx.Identifier{rangeConstraint}.Sanitize()}
		for _, q := range []string{"migrate.range_lock", "migrate.range_dedupe", "migrate.range_constrain"} {
			if _, err := tx.Exec(ctx, queries.Text(q, args)); err != nil {
				return err
			}
		}
		return nil
	})
}

// sessionLocker is goose's per-schema session lock, taken with pollLock:
// goose's own locker polls every 5 s and gives up after 5 minutes, so a
// fleet of instances starting together would queue 5 s apiece and the last
// ones fail.
type sessionLocker struct{ id int64 }

func (l sessionLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	return pollLock(ctx, func() (got bool, err error) {
		err = conn.QueryRowContext(ctx, queries.Static("advisory.try_lock"), l.id).Scan(&got)
		return got, err
	})
}

func (l sessionLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	var held bool
	if err := conn.QueryRowContext(ctx, queries.Static("advisory.unlock"), l.id).Scan(&held); err != nil {
		return err
	}
	if !held {
		return errors.New("pglimit: migrate: the schema's lock was not held at unlock")
	}
	return nil
}

// pollLock calls try until it takes the lock or ctx ends. It polls rather
// than wait in pg_advisory_lock: a waiting statement holds a snapshot, and
// CREATE INDEX CONCURRENTLY in the lock holder's migration waits for every
// snapshot in the database, so holder and waiter would wait for each other
// through the application, where no deadlock detector sees them.
func pollLock(ctx context.Context, try func() (bool, error)) error {
	const maxPause = 250 * time.Millisecond
	pause := 5 * time.Millisecond
	for {
		got, err := try()
		if err != nil || got {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
		pause = min(2*pause, maxPause)
	}
}
