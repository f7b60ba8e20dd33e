-- The general statement decides for any set of limits on the Upsert and
-- NoWait tables. Its shape is that of a decision with an id (key_row_tail_id): the key's row
-- locked only if the request fits it, re-checked by the lock on the latest
-- row version, and decided once more at the clock read after the lock,
-- which is what the UPDATE writes; for a key with no row, an advisory lock
-- on the key before the clock is read, and the INSERT; else the row as the
-- snapshot sees it, which is the answer if it refuses (no lock, no write).
-- No row at all means the key changed after the snapshot, and the
-- statement is run again.
--
-- The statement decides and writes; it returns the state it decided on and
-- the time, from which the limiter computes the rest of the Decision
-- (arith.Evaluate). The decision is SQL that arith.DecisionSQL writes for
-- the limiter's own limits, their periods and rates inlined as constants:
-- plain arithmetic, where a function call per evaluation (the PL/pgSQL
-- pglimit_decide of migration 00004, which computes the same) cost as much
-- as the rest of the statement.
--
-- Placeholders: table; setting and returning, as in key_row.allow; lock,
-- the lock clause (FOR UPDATE, or nowait.lock); admits, new_state and
-- new_expires, whether x (state, tat, now) admits the request, its new
-- state and its new expires_at; guard, whether c (the same) does; state,
-- the state column as the statement reads it (of the limits' shape, else
-- NULL). $1 namespace, $2 key, $3 the key's lock class, $4 n, and for
-- Reserve $5 the maximum delay in µs.
{{define "general.allow"}}
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
){{template "general.write_decided" .}}
SELECT true, state, tat, now, {{.setting}} FROM decided
WHERE CASE WHEN new THEN EXISTS (SELECT FROM inserted) ELSE EXISTS (SELECT FROM updated) END
UNION ALL
SELECT false, x.state, x.tat, x.now, NULL::text FROM current AS x WHERE NOT {{.admits}} AND NOT EXISTS (SELECT FROM updated)
{{end}}

-- general.write_decided ends the general statements' CTEs: the decided row
-- written, by an UPDATE of the key's row or the INSERT of a new key.
{{define "general.write_decided"}}, updated AS (
    UPDATE {{.table}} AS t
    SET state = d.new_state, expires_at = timestamptz 'epoch' + d.new_expires * interval '1 microsecond'
    FROM decided AS d
    WHERE t.namespace = $1 AND t.key = $2 AND d.admits AND NOT d.new
    RETURNING 1{{.returning}}
), inserted AS (
    INSERT INTO {{.table}} (namespace, key, state, expires_at)
    SELECT $1, $2, d.new_state, timestamptz 'epoch' + d.new_expires * interval '1 microsecond'
    FROM decided AS d WHERE d.admits AND d.new
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING 1{{.returning}}
){{end}}

-- general.peek is the key's row as the snapshot sees it, and the time:
-- Peek decides on them without the database. $1 namespace, $2 key.
{{define "general.peek"}}
SELECT NULL::boolean, t.state, (extract(epoch FROM t.expires_at) * 1000000)::bigint,
    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, NULL::text
FROM (SELECT) AS one LEFT JOIN {{.table}} AS t ON t.namespace = $1 AND t.key = $2
{{end}}

-- zones.known fails with SQLSTATE 22023 if the server does not know one of
-- the zones $1 (a limiter's calendar windows'), which Go knew: the check
-- a limiter makes once, before its first decision, so that every entry
-- point (Peek, which decides without the zone, among them) reports it.
{{define "zones.known"}}SELECT count(now() AT TIME ZONE z) FROM unnest($1::text[]) AS z{{end}}
