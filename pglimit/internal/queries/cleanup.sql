-- The Cleaner's statements, on one limiter table each.

-- The inner SELECT picks at most $2 rows from the oldest end of the index,
-- skipping rows a request holds locked; its FOR UPDATE re-checks the
-- condition on a row updated since the statement's snapshot, so a key
-- readmitted meanwhile is not picked. The outer condition repeats the test
-- on the row the DELETE sees. A row is deleted only if its limits ended
-- more than $1 ago by the database clock, and a Range row whose upper bound
-- is infinite never is.
{{define "cleanup.delete"}}
DELETE FROM {{.table}}
WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {{.table}}
        WHERE {{.end}} < now() - $1::interval
        ORDER BY {{.end}}
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
  AND {{.end}} < now() - $1::interval
{{end}}

-- cleanup.sweep deletes, among the rows stored in blocks [$2, $3), at most $4
-- whose limits ended more than $1 ago, and returns how many, with the
-- table's size in blocks ($5 is its name). The block range makes it a TID
-- range scan (PostgreSQL 14+): each batch reads at most $3 - $2 blocks.
{{define "cleanup.sweep"}}
WITH deleted AS (
    DELETE FROM {{.table}}
    WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM {{.table}}
            WHERE ctid >= format('(%s,0)', $2::bigint)::tid AND ctid < format('(%s,0)', $3::bigint)::tid
              AND {{.end}} < now() - $1::interval
            LIMIT $4
            FOR UPDATE SKIP LOCKED))
      AND {{.end}} < now() - $1::interval
    RETURNING 1
)
SELECT (SELECT count(*) FROM deleted), pg_relation_size($5::regclass) / current_setting('block_size')::bigint
{{end}}

-- cleanup.describe: whether table $1 exists, its expires_at and during
-- columns with their types, and whether an index leads with expires_at.
{{define "cleanup.describe"}}
SELECT c.oid IS NOT NULL,
       coalesce((SELECT array_agg(a.attname::text || ' ' || format_type(a.atttypid, a.atttypmod))
                 FROM pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                   AND a.attname IN ('expires_at', 'during')), '{}'),
       EXISTS (SELECT FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
               WHERE i.indrelid = c.oid AND i.indisvalid AND a.attname = 'expires_at')
FROM (SELECT to_regclass($1) AS oid) c
{{end}}

-- cleanup.keys picks the keys of at most $2 rows whose limit ended more
-- than $1 ago, oldest first; cleanup.keyed_delete deletes the expired rows
-- of those keys ($2), and re-checks the condition on the row version it
-- deletes, so a key admitted again since it was picked is not deleted.
-- Both run on every shard of a Citus table; now() is the coordinator's,
-- one value for all of them.
{{define "cleanup.keys"}}
SELECT coalesce(array_agg(DISTINCT k.key), '{}')
FROM (SELECT key FROM {{.table}} WHERE {{.end}} < now() - $1::interval ORDER BY {{.end}} LIMIT $2) AS k
{{end}}

{{define "cleanup.keyed_delete"}}
DELETE FROM {{.table}}
WHERE key = ANY ($2::text[])
  AND {{.end}} < now() - $1::interval
{{end}}

-- cleanup.distributed tells whether a table is a Citus distributed table, and
-- whether this session is on the coordinator, where the cleaners' leader
-- lock must be taken: an advisory lock is one node's.
{{define "cleanup.distributed"}}
SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1)),
       citus_is_coordinator()
{{end}}

-- cleanup.statement_timeout bounds the leader's statements ($1, say '5000ms').
{{define "cleanup.statement_timeout"}}SELECT set_config('statement_timeout', $1, false){{end}}

-- cleanup.backlog is table $2's size in bytes, its estimated rows, and of
-- its rows whose limits ended more than $1 ago (which a cleaner run
-- deletes), how many and how long ago the oldest became so, in µs
-- (NULL if none). It reads the whole table: for the person on call, never
-- for a decision.
{{define "cleanup.backlog"}}
SELECT pg_total_relation_size($2::regclass), (SELECT greatest(c.reltuples, 0)::bigint FROM pg_class AS c WHERE c.oid = $2::regclass),
    count(*), (extract(epoch FROM now() - $1::interval - min({{.end}})) * 1000000)::bigint
FROM {{.table}} WHERE {{.end}} < now() - $1::interval
{{end}}

-- cleanup.leader is the session that holds the cleaners' leader lock $1
-- (a bigint advisory lock) in this database, if any: its process id,
-- application name, when its connection began and when its state last
-- changed (its last batch's end, when idle). Another role's session shows
-- its process id only, unless the caller has pg_read_all_stats.
{{define "cleanup.leader"}}
SELECT l.pid, coalesce(a.application_name, ''), a.backend_start, a.state_change
FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid
{{end}}
