// Package migrations holds pglimit's SQL schema as goose v3 migrations.
//
// The files are plain SQL with unqualified table names, so they land in the
// schema first on the search_path. pglimit.Migrate applies them with its own
// version table, after creating the btree_gist extension in its own schema
// (pglimit_ext) if the database lacks it; the goose CLI can apply the same
// directory once the extension exists:
//
//	psql "$DATABASE_URL" -c 'CREATE SCHEMA IF NOT EXISTS pglimit_ext' -c 'CREATE EXTENSION IF NOT EXISTS btree_gist SCHEMA pglimit_ext'
//	goose -dir migrations -table pglimit_goose_db_version postgres "$DATABASE_URL" up
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS
