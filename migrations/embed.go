// Package migrations holds pglimit's SQL schema as goose v3 migrations.
//
// The files are plain SQL with unqualified table names, so they land in the
// schema first on the search_path. pglimit.Migrate applies them with its own
// version table; the goose CLI can apply the same directory:
//
//	goose -dir migrations -table pglimit_goose_db_version postgres "$DATABASE_URL" up
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS
