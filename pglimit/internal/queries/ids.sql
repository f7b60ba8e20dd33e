-- The statements of decisions with an id (pglimit.WithID), on the Upsert
-- and NoWait tables. Each is its id-less statement (key_row.allow's
-- decision, general.allow) with the id written in the same statement,
-- between the decision and its write:
--
--   claimed inserts the id's row into the ids table (migration 00013) only
--   when the decision admits, ON CONFLICT DO NOTHING; the key's row is
--   written only if claimed did insert. A concurrent decision of the same
--   id waits on the primary key for the first one's transaction: if it
--   commits, the conflict inserts nothing, so this one charges nothing and
--   answers that the id was taken (the first column true); if it rolls
--   back (an AllowTx whose transaction did), this one inserts and charges.
--   A refusal inserts no row: an id first refused is decided afresh.
--
--   A new key's row is inserted without ON CONFLICT: a concurrent first
--   decision of the key that committed after this statement's snapshot
--   makes it fail with unique_violation (23505), which undoes the id's row
--   with it, and the caller runs the statement again. (The id-less
--   statement answers no row there instead; here the id's row would stay.)
--
-- The first column is whether the id was taken; the rest are the id-less
-- statement's answer, which for a taken id are placeholders.
--
-- Placeholders: table, ids (the ids table), setting and returning as in
-- key_row.allow. $1 namespace, $2 key, $3 n*T µs, $4 the key's lock class,
-- $5 tau µs, $6 the id, $7 n, $8 the id's retention in µs.
{{define "upsert.allow_id"}}
WITH locked AS (
    SELECT t.expires_at FROM {{.table}} AS t
    WHERE t.namespace = $1 AND t.key = $2 AND t.expires_at <= clock_timestamp() + $5::bigint * interval '1 microsecond'
    {{template "upsert.lock"}}
),{{template "key_row_tail_id" .}}
{{end}}

{{define "nowait.allow_id"}}
WITH locked AS (
    SELECT t.expires_at FROM {{.table}} AS t
    WHERE t.namespace = $1 AND t.key = $2 AND t.expires_at <= clock_timestamp() + $5::bigint * interval '1 microsecond'
    {{template "nowait.lock"}}
),{{template "key_row_tail_id" .}}
{{end}}

-- key_row_tail_id ends upsert.allow_id and nowait.allow_id, which begin
-- with locked, the key's row once locked if the request fits (FOR UPDATE
-- re-checks that on the latest row version, after any wait): decided is
-- the TAT the admission writes and its time, read after the lock, from the
-- locked row or for a new key; the write follows the row by its key, which
-- reaches the version the lock waited for. A new key takes key_row.allow's
-- advisory lock before it reads the clock; a refusal locks and writes
-- nothing; no row at all means the key changed after the snapshot.
{{define "key_row_tail_id"}}
stamp AS (
    SELECT l.expires_at, clock_timestamp() AS now FROM locked AS l
), current AS (
    SELECT t.expires_at, clock_timestamp() AS now FROM {{.table}} AS t
    WHERE t.namespace = $1 AND t.key = $2
), first AS (
    SELECT pg_advisory_xact_lock($4::integer, hashtext($2))
    WHERE NOT EXISTS (SELECT FROM locked) AND NOT EXISTS (SELECT FROM current)
), fresh AS (
    SELECT clock_timestamp() AS now FROM first
), decided AS (
    SELECT greatest(s.expires_at, s.now) + $3::bigint * interval '1 microsecond' AS tat, s.now, false AS new FROM stamp AS s
    UNION ALL
    SELECT f.now + $3::bigint * interval '1 microsecond', f.now, true FROM fresh AS f
), claimed AS (
    INSERT INTO {{.ids}} (namespace, id, key, n, tat, now, expires_at)
    SELECT $1, $6, $2, $7, (extract(epoch FROM d.tat) * 1000000)::bigint, (extract(epoch FROM d.now) * 1000000)::bigint,
        d.now + $8::bigint * interval '1 microsecond'
    FROM decided AS d
    ON CONFLICT (namespace, id) DO NOTHING
    RETURNING 1
), updated AS (
    UPDATE {{.table}} AS t
    SET expires_at = d.tat
    FROM decided AS d
    WHERE t.namespace = $1 AND t.key = $2 AND NOT d.new AND EXISTS (SELECT FROM claimed)
    RETURNING 1{{.returning}}
), inserted AS (
    INSERT INTO {{.table}} (namespace, key, expires_at)
    SELECT $1, $2, d.tat FROM decided AS d
    WHERE d.new AND EXISTS (SELECT FROM claimed)
    RETURNING 1{{.returning}}
)
SELECT false, true, (extract(epoch FROM d.tat) * 1000000)::bigint, (extract(epoch FROM d.now) * 1000000)::bigint, {{.setting}}
FROM decided AS d
WHERE CASE WHEN d.new THEN EXISTS (SELECT FROM inserted) ELSE EXISTS (SELECT FROM updated) END
UNION ALL
SELECT true, false, 0::bigint, 0::bigint, NULL::text
FROM decided WHERE NOT EXISTS (SELECT FROM claimed)
UNION ALL
SELECT false, false, (extract(epoch FROM expires_at) * 1000000)::bigint, (extract(epoch FROM now) * 1000000)::bigint, NULL::text
FROM current
WHERE expires_at > now + $5::bigint * interval '1 microsecond' AND NOT EXISTS (SELECT FROM decided)
{{end}}

-- general.allow_id is general.allow with the id claimed, in any of its
-- modes. Placeholders: general.allow's; ids; id and retention, the
-- parameters of the id and its retention in µs ($5 and $6, or $6 and $7
-- after Reserve's maximum delay); mode_column and mode_value, empty for
-- Allow's mode (the column's default), else the mode column and its value.
-- $1 namespace, $2 key, $3 the key's lock class, $4 n.
{{define "general.allow_id"}}
WITH locked AS (
    SELECT t.state, t.expires_at FROM {{.table}} AS t
    WHERE t.namespace = $1 AND t.key = $2
      AND (SELECT {{.guard}} FROM (SELECT {{.state}} AS state, (extract(epoch FROM t.expires_at) * 1000000)::bigint AS tat,
               (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now) AS c)
    {{.lock}}
), current AS (
    SELECT {{.state}} AS state, (extract(epoch FROM t.expires_at) * 1000000)::bigint AS tat,
        (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now
    FROM {{.table}} AS t WHERE t.namespace = $1 AND t.key = $2
), first AS (
    SELECT pg_advisory_xact_lock($3::integer, hashtext($2))
    WHERE NOT EXISTS (SELECT FROM current)
), stamp AS (
    SELECT {{.state}} AS state, (extract(epoch FROM t.expires_at) * 1000000)::bigint AS tat,
        (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now, false AS new FROM locked AS t
    UNION ALL
    SELECT NULL, NULL, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, true FROM first
), decided AS (
    SELECT x.*, {{.admits}} AS admits, {{.new_state}} AS new_state, {{.new_expires}} AS new_expires FROM stamp AS x
), claimed AS (
    INSERT INTO {{.ids}} (namespace, id, key, n, state, tat, now, expires_at{{.mode_column}})
    SELECT $1, {{.id}}, $2, $4, d.state, d.tat, d.now, timestamptz 'epoch' + (d.now + {{.retention}}::bigint) * interval '1 microsecond'{{.mode_value}}
    FROM decided AS d WHERE d.admits
    ON CONFLICT (namespace, id) DO NOTHING
    RETURNING 1
), updated AS (
    UPDATE {{.table}} AS t
    SET state = d.new_state, expires_at = timestamptz 'epoch' + d.new_expires * interval '1 microsecond'
    FROM decided AS d
    WHERE t.namespace = $1 AND t.key = $2 AND d.admits AND NOT d.new AND EXISTS (SELECT FROM claimed)
    RETURNING 1{{.returning}}
), inserted AS (
    INSERT INTO {{.table}} (namespace, key, state, expires_at)
    SELECT $1, $2, d.new_state, timestamptz 'epoch' + d.new_expires * interval '1 microsecond'
    FROM decided AS d WHERE d.admits AND d.new AND EXISTS (SELECT FROM claimed)
    RETURNING 1{{.returning}}
)
SELECT false, true, state, tat, now, {{.setting}} FROM decided
WHERE CASE WHEN new THEN EXISTS (SELECT FROM inserted) ELSE EXISTS (SELECT FROM updated) END
UNION ALL
SELECT true, NULL::boolean, NULL::bigint[], NULL::bigint, 0::bigint, NULL::text FROM decided WHERE admits AND NOT EXISTS (SELECT FROM claimed)
UNION ALL
SELECT false, false, x.state, x.tat, x.now, NULL::text FROM current AS x
WHERE NOT {{.admits}} AND NOT EXISTS (SELECT FROM decided WHERE admits)
{{end}}

-- ids.lookup reads an id's row: what its decision statement answered
-- (with the general statement's state and mode), its key, units, whether
-- it was refunded or settled by id (done), and the time now, in µs. $1
-- namespace, $2 the id. Placeholder: ids.
{{define "ids.lookup"}}
SELECT state, tat, now, key, n, done, mode, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
FROM {{.ids}} WHERE namespace = $1 AND id = $2
{{end}}
