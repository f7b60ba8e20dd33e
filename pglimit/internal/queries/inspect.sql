-- inspect.key reads what a key's row holds and the time, for Inspect,
-- which works out each limit's standing in Go (arith.Stand): $1
-- namespace, $2 key. Placeholders: table; own, the join of the key's own
-- limits (overrides.own) or nothing; own_cols, that row's limits and
-- expiry, or NULLs.
{{define "inspect.key"}}
SELECT t.state, (extract(epoch FROM t.expires_at) * 1000000)::bigint,
    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, {{.own_cols}}
FROM (SELECT) AS one
LEFT JOIN {{.table}} AS t ON t.namespace = $1 AND t.key = $2
{{.own}}
{{end}}

-- inspect.own joins the key $2's row of the overrides table while it
-- counts, as o. Placeholders: overrides, counts.
{{define "inspect.own"}}
LEFT JOIN {{.overrides}} AS o ON o.namespace = $1 AND o.key = $2 AND {{.counts}}{{end}}

-- inspect.limited is a page of the keys of namespace $1, after $2 in key
-- order, at most $3 of them, that would refuse a request of $4 units now:
-- each with its row, as JSON, and the time (one reading for all). Only a
-- row that still holds state (expires_at ahead) can refuse. It reads the
-- namespace's rows in key order until it has $3: a sequential walk of the
-- primary key, bounded by the caller's timeout, never run by a decision.
-- Placeholders: table; state, the state column as the limits read it;
-- own, the LATERAL join of each key's own limits, own_cols their columns
-- in the answer, both empty without overrides; refuses, whether x refuses
-- $4 units (arith.DecisionSQL).
{{define "inspect.limited"}}
WITH x AS (
    SELECT t.key, {{.state}} AS state, (extract(epoch FROM t.expires_at) * 1000000)::bigint AS tat,
        (extract(epoch FROM now()) * 1000000)::bigint AS now{{.own_fields}}
    FROM {{.table}} AS t{{.own}}
    WHERE t.namespace = $1 AND t.key > $2 AND t.expires_at > now()
)
SELECT (extract(epoch FROM now()) * 1000000)::bigint, coalesce((
    SELECT jsonb_agg(jsonb_build_object('key', p.key, 'state', p.state, 'tat', p.tat{{.own_cols}}) ORDER BY p.key)
    FROM (SELECT * FROM x WHERE {{.refuses}} ORDER BY x.key LIMIT $3) AS p), '[]')
{{end}}
