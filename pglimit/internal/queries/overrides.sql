-- overrides.allow is general.allow for a limiter with Config.Overrides:
-- eff is the key's limits, its override's rate and burst where it has one,
-- the limiter's elsewhere; every decision reads them as columns (r<i>,
-- t<i>, bt<i>: rate, emission interval and burst span) in place of the
-- limits' constants, and the statement returns the rates and bursts it
-- decided with, and the names the key's row gives that the limiter lacks.
-- A row the limits cannot use (ok false) refuses every request, and so
-- does a cost past what the key's limits admit at once: a new key gets a
-- refusal too (the last branch), from which the limiter reports the
-- error. Placeholders: general.allow's, and overrides, the overrides
-- table; raw, the raw rate and burst of each limit and the unknown names;
-- derived, the columns derived from them, ok among them; limits_out, the
-- rates, bursts and unknown names returned; counts, whether the row o
-- counts now (overrideCounts: it has not lapsed).
{{define "overrides.allow"}}
WITH eff AS (
    SELECT {{.derived}} FROM (
        SELECT {{.raw}} FROM (SELECT) AS one
        LEFT JOIN {{.overrides}} AS o ON o.namespace = $1 AND o.key = $2 AND {{.counts}}) AS raw
), locked AS (
    SELECT t.state, t.expires_at FROM {{.table}} AS t
    WHERE t.namespace = $1 AND t.key = $2
      AND (SELECT {{.guard}} FROM (SELECT {{.state}} AS state, (extract(epoch FROM t.expires_at) * 1000000)::bigint AS tat,
               (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now, eff.* FROM eff) AS c)
    {{.lock}}
), current AS (
    SELECT {{.state}} AS state, (extract(epoch FROM t.expires_at) * 1000000)::bigint AS tat,
        (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now, eff.*
    FROM {{.table}} AS t, eff WHERE t.namespace = $1 AND t.key = $2
), first AS (
    SELECT pg_advisory_xact_lock($3::integer, hashtext($2))
    WHERE NOT EXISTS (SELECT FROM current)
), stamp AS (
    SELECT {{.state}} AS state, (extract(epoch FROM t.expires_at) * 1000000)::bigint AS tat,
        (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now, false AS new, eff.* FROM locked AS t, eff
    UNION ALL
    SELECT NULL, NULL, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, true, eff.* FROM first, eff
), decided AS (
    SELECT x.*, {{.admits}} AS admits, {{.new_state}} AS new_state, {{.new_expires}} AS new_expires FROM stamp AS x
){{template "general.write_decided" .}}
SELECT true, x.state, x.tat, x.now, {{.setting}}, {{.limits_out}} FROM decided AS x
WHERE CASE WHEN x.new THEN EXISTS (SELECT FROM inserted) ELSE EXISTS (SELECT FROM updated) END
UNION ALL
SELECT false, x.state, x.tat, x.now, NULL::text, {{.limits_out}} FROM current AS x WHERE NOT {{.admits}} AND NOT EXISTS (SELECT FROM updated)
UNION ALL
SELECT false, x.state, x.tat, x.now, NULL::text, {{.limits_out}} FROM decided AS x WHERE x.new AND NOT x.admits
{{end}}

-- overrides.peek is general.peek with the key's limits.
{{define "overrides.peek"}}
WITH eff AS (
    SELECT {{.derived}} FROM (
        SELECT {{.raw}} FROM (SELECT) AS one
        LEFT JOIN {{.overrides}} AS o ON o.namespace = $1 AND o.key = $2 AND {{.counts}}) AS raw
)
SELECT NULL::boolean, t.state, (extract(epoch FROM t.expires_at) * 1000000)::bigint,
    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, NULL::text, {{.limits_out}}
FROM eff AS x LEFT JOIN {{.table}} AS t ON t.namespace = $1 AND t.key = $2
{{end}}

-- overrides.delete and overrides.set remove and set a key's own limits
-- (SetKeyLimits): $1 namespace, $2 key, $3 the limits as JSON, $4 how long
-- they count in µs (NULL: for good). Placeholder: overrides, the table.
{{define "overrides.delete"}}DELETE FROM {{.overrides}} WHERE namespace = $1 AND key = $2{{end}}
{{define "overrides.set"}}
INSERT INTO {{.overrides}} (namespace, key, limits, expires_at, updated_at)
VALUES ($1, $2, $3, now() + $4::bigint * interval '1 microsecond', now())
ON CONFLICT (namespace, key) DO UPDATE SET limits = excluded.limits, expires_at = excluded.expires_at, updated_at = now()
{{end}}

-- overrides.list is a page of a namespace's rows that count now, by key
-- after $2, at most $3 of them (ListKeyLimits), as one JSON array: $1
-- namespace. Placeholders: overrides, counts.
{{define "overrides.list"}}
SELECT coalesce(jsonb_agg(jsonb_build_object('key', p.key, 'limits', p.limits, 'expires', p.expires_at, 'updated', p.updated_at)
    ORDER BY p.key), '[]') FROM (
    SELECT o.key, o.limits, o.expires_at, o.updated_at FROM {{.overrides}} AS o
    WHERE o.namespace = $1 AND o.key > $2 AND {{.counts}}
    ORDER BY o.key LIMIT $3) AS p
{{end}}
