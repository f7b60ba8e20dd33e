-- Migrate's statements around goose, which applies the migrations of the
-- repository's migrations folder; and the session locks that serialize
-- Migrate and Distribute between instances ($1 the lock's id).
{{define "advisory.try_lock"}}SELECT pg_try_advisory_lock($1){{end}}
{{define "advisory.unlock"}}SELECT pg_advisory_unlock($1){{end}}

-- migrate.read_only: whether the server cannot take writes (a standby, or
-- read-only mode).
{{define "migrate.read_only"}}SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool{{end}}

-- The schema ($1, and placeholder schema, quoted) and the btree_gist
-- extension, created unless they exist.
{{define "migrate.schema_exists"}}SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1){{end}}
{{define "migrate.create_schema"}}CREATE SCHEMA IF NOT EXISTS {{.schema}}{{end}}
{{define "migrate.has_btree_gist"}}SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'btree_gist'){{end}}
{{define "migrate.create_btree_gist"}}CREATE EXTENSION IF NOT EXISTS btree_gist SCHEMA {{.schema}}{{end}}

-- The repair of a Range table ($1) that lost its exclusion constraint
-- ($2; placeholders table and constraint, quoted), or was migrated without
-- it, once the database has btree_gist: of two overlapping rows
-- of one key the later one goes, under a lock against writers, and the
-- constraint comes back.
{{define "migrate.range_unconstrained"}}
SELECT to_regclass($1) IS NOT NULL
   AND NOT EXISTS (SELECT FROM pg_constraint WHERE conrelid = to_regclass($1) AND conname = $2),
       EXISTS (SELECT FROM pg_extension WHERE extname = 'btree_gist')
{{end}}
{{define "migrate.range_lock"}}LOCK TABLE {{.table}} IN ACCESS EXCLUSIVE MODE{{end}}
{{define "migrate.range_dedupe"}}
DELETE FROM {{.table}} AS a USING {{.table}} AS b
WHERE a.namespace = b.namespace AND a.key = b.key AND a.during && b.during
  AND (lower(b.during), b.ctid) < (lower(a.during), a.ctid)
{{end}}
{{define "migrate.range_constrain"}}
ALTER TABLE {{.table}} ADD CONSTRAINT {{.constraint}}
    EXCLUDE USING gist (namespace WITH =, key WITH =, during WITH &&)
{{end}}
