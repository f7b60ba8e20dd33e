-- The settle statement (pglimit.Settle) settles an admission at its real
-- cost: it gives back the units the estimate exceeded it by ($4), or
-- charges those it fell short by ($5), on the key's row locked, with the
-- clock read after the lock. arith.SettleSQL writes the arithmetic. Like a
-- refund, it touches the row only if the write that made the admission
-- did not roll back or is not still open (refund.made), and gives back
-- units only if that write is known to have committed. It answers one
-- row: how the admission's transaction ended, the row as it found it
-- (NULL when there is none), the units given back and charged, and the
-- row as it left it.
--
-- $1 namespace, $2 key, $3 the admission's anchors (one per limit), $4
-- the units to give back, $5 the units to charge, $6 the admission's
-- transaction (refund.made), and $7, $8, $9 the rates, emission intervals
-- and burst spans of the limits the admission was decided with (a key's
-- own, with Overrides). Placeholders: table; state, the state column as
-- the statement reads it (arith.Shaped of o.state); charged, new_state and
-- new_expires, which arith.SettleSQL writes on x, with the units charged
-- in x.units.
{{define "settle"}}
WITH made AS (
    SELECT {{template "refund.made" "$6"}} AS status
){{template "settle.tail" .}}
{{end}}

-- settle.id settles by decision id (SettleID): made marks the id's row
-- settled, only a row neither settled nor refunded yet, and, for a
-- charge ($5 > 0), only while the key has a row to charge: with none,
-- the statement marks nothing and answers no row, and the caller inserts
-- a blank row and runs it again. A marked row was written with its
-- admission, so that admission committed. Two settles of one id race on
-- the row's lock: the second marks nothing. Unmarked, nothing is
-- written: old reads no row (unmade false). $6 is the id. Placeholders:
-- settle's, and ids.
{{define "settle.id"}}
WITH made AS (
    UPDATE {{.ids}} SET done = 'settled' WHERE namespace = $1 AND id = $6 AND done IS NULL
      AND ($5::bigint = 0 OR EXISTS (SELECT FROM {{.table}} WHERE namespace = $1 AND key = $2))
    RETURNING 'committed'::text AS status
){{template "settle.tail" .}}
{{end}}

-- settle.tail ends settle and settle.id, after made. Placeholder unmade:
-- whether the key's row is settled when made has no row (true for
-- settle, false for settle.id).
{{define "settle.tail"}}, old AS MATERIALIZED (
    SELECT t.state, t.expires_at FROM {{.table}} AS t
    WHERE t.namespace = $1 AND t.key = $2
      AND coalesce((SELECT status FROM made) NOT IN ('aborted', 'in progress'), {{.unmade}})
    FOR UPDATE
), x AS MATERIALIZED (
    SELECT {{.state}} AS state, (extract(epoch FROM o.expires_at) * 1000000)::bigint AS tat,
        (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now,
        CASE WHEN (SELECT status FROM made) = 'committed' THEN $4::bigint ELSE 0 END AS back,
        $7::bigint[] AS rates, $8::bigint[] AS ts, $9::bigint[] AS bts
    FROM old AS o
), settled AS MATERIALIZED (
    SELECT x.*, {{.charged}} AS units FROM x
), changed AS (
    UPDATE {{.table}} AS t
    SET state = {{.new_state}}, expires_at = timestamptz 'epoch' + {{.new_expires}} * interval '1 microsecond'
    FROM settled AS x
    WHERE t.namespace = $1 AND t.key = $2
    RETURNING t.state, (extract(epoch FROM t.expires_at) * 1000000)::bigint AS tat
)
SELECT m.status, x.state, x.tat, x.now, x.back, x.units, c.state, c.tat
FROM made AS m LEFT JOIN settled AS x ON true LEFT JOIN changed AS c ON true
{{end}}
