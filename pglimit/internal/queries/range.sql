-- Range inserts [now, now+cooldown) into a table whose exclusion constraint
-- forbids two overlapping ranges for one key.
--
-- A live cooldown in the statement's snapshot is a refusal, read without
-- a lock or a write. Otherwise the statement takes a transaction-level
-- advisory lock on the key, so that it waits for a concurrent admission
-- (in a caller's open transaction, say) before it reads the clock, and
-- inserts its range from then. ON CONFLICT DO NOTHING (allowed with an
-- exclusion constraint, unlike DO UPDATE) turns an overlap with an
-- admission committed after the snapshot into no row instead of an error,
-- so racing inserts neither abort nor deadlock; the caller then runs the
-- statement again on a fresh snapshot.
{{define "range.allow"}}
WITH clock AS (
    SELECT clock_timestamp() AS now
), current AS (
    SELECT upper(t.during) AS expires_at, c.now FROM clock AS c, {{.table}} AS t
    WHERE t.namespace = $1 AND t.key = $2
      AND t.during && tstzrange(c.now, NULL)
    ORDER BY upper(t.during) DESC
    LIMIT 1
), first AS (
    SELECT pg_advisory_xact_lock($4::integer, hashtext($2))
    WHERE NOT EXISTS (SELECT FROM current)
), stamp AS (
    SELECT clock_timestamp() AS now FROM first
), admitted AS (
    INSERT INTO {{.table}} (namespace, key, during)
    SELECT $1, $2, tstzrange(now, now + $3::bigint * interval '1 microsecond') FROM stamp
    ON CONFLICT DO NOTHING
    RETURNING upper(during) AS expires_at
)
SELECT true, (extract(epoch FROM a.expires_at) * 1000000)::bigint, (extract(epoch FROM s.now) * 1000000)::bigint, {{.setting}}
FROM admitted AS a, stamp AS s
UNION ALL
SELECT false, (extract(epoch FROM expires_at) * 1000000)::bigint, (extract(epoch FROM now) * 1000000)::bigint, NULL::text
FROM current
{{end}}

-- range.peek reads the key's live cooldown, if any, and the clock.
{{define "range.peek"}}
SELECT (SELECT (extract(epoch FROM max(upper(t.during))) * 1000000)::bigint FROM {{.table}} AS t
        WHERE t.namespace = $1 AND t.key = $2 AND t.during && tstzrange(c.now, NULL)),
       (extract(epoch FROM c.now) * 1000000)::bigint
FROM (SELECT clock_timestamp() AS now) AS c
{{end}}

-- Without its exclusion constraint the Range table admits every request:
-- the constraint is the limiter. It can go missing behind the limiter's
-- back, with the btree_gist extension it needs (DROP EXTENSION ... CASCADE).
{{define "range.exclusion_exists"}}
SELECT EXISTS (SELECT FROM pg_constraint WHERE conrelid = to_regclass($1) AND contype = 'x'),
       EXISTS (SELECT FROM pg_extension WHERE extname = 'btree_gist')
{{end}}
