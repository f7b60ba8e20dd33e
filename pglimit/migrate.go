package pglimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/pglimit/cooldown/migrations"
)

// MigrationsTable is the goose version table pglimit keeps in the schema it
// migrates. It differs from goose's default so that an application that
// runs its own goose migrations in the same schema never collides with ours.
const MigrationsTable = "pglimit_goose_db_version"

// ErrExtension reports that the btree_gist extension, which the Range
// strategy's exclusion constraint needs, could not be created.
var ErrExtension = errors.New("pglimit: cannot create extension btree_gist, which the Range strategy needs; " +
	"install PostgreSQL's contrib modules (Debian/Ubuntu: apt-get install postgresql-contrib) " +
	"and run CREATE EXTENSION btree_gist as a superuser or a role with CREATE on the database")

// Migrate creates or upgrades pglimit's tables in schema ("" means
// "public"), creating the schema if needed. It is safe to run from every
// instance at start-up: a session advisory lock derived from the schema name
// serializes concurrent runs.
//
// It dials its own connection from pool's configuration, so the pool's
// connections never see the search_path it sets.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	schema = cmp.Or(schema, defaultSchema)
	if err := ValidateIdentifier(schema); err != nil {
		return fmt.Errorf("%w: schema: %w", ErrInvalidConfig, err)
	}
	// CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the
	// schema exists; a least-privileged role may lack it.
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil {
		return fmt.Errorf("pglimit: migrate: %w", err)
	}
	if !exists {
		if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return fmt.Errorf("pglimit: migrate: create schema %s: %w", schema, err)
		}
	}

	connCfg := pool.Config().ConnConfig.Copy()
	connCfg.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	db := stdlib.OpenDB(*connCfg)
	defer db.Close()

	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(migrationLockID(schema)))
	if err != nil {
		return fmt.Errorf("pglimit: migrate: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithDisableGlobalRegistry(true),
		goose.WithTableName(MigrationsTable),
		goose.WithSessionLocker(locker),
	)
	if err != nil {
		return fmt.Errorf("pglimit: migrate: %w", err)
	}
	if _, err := provider.Up(ctx); err != nil {
		if isExtensionError(err) {
			return fmt.Errorf("%w: %w", ErrExtension, err)
		}
		return fmt.Errorf("pglimit: migrate: %w", err)
	}
	return nil
}

// migrationLockID gives each schema its own goose lock, so migrating one
// schema never waits for another (and never for other goose users, whose
// default lock id is shared).
func migrationLockID(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("pglimit/migrate/" + schema))
	return int64(h.Sum64() >> 1)
}

// isExtensionError recognises CREATE EXTENSION btree_gist failing: the
// control file is missing (contrib not installed) or the role may not
// create it.
func isExtensionError(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	if !ok {
		return false
	}
	switch pgErr.Code {
	case "58P01", "0A000", "42501": // undefined_file, feature_not_supported, insufficient_privilege
		return strings.Contains(pgErr.Message, "extension")
	}
	return false
}
