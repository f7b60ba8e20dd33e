-- batch.general is batch.allow for any set of limits (the general
-- statement's, general.sql): it decides many keys at once, each key
-- admitting as many of its calls, in order, each all or nothing, as its
-- limits admit at the statement's clock reading. $2 the keys, $3 each
-- key's units per call and $5 its number of calls; $4 the keys' lock class.
-- It never waits for a lock and skips what batch.allow skips, for the same
-- reasons (read batch.allow's comment): a row locked by a concurrent
-- decision, a new key whose advisory lock is held, a key that changed
-- after the snapshot. Their callers decide them with the statement for
-- one key, which waits (Upsert) or refuses (NoWait).
--
-- It reads each key once, as batch.allow does: by the primary key (a
-- LATERAL subquery per key), keeping the row's ctid, through which a key
-- that fits is locked and written; a row that moved after the snapshot is
-- left unanswered. A refusal is decided on the row as read: it takes no
-- lock and writes nothing. With wait set, the statement for one key locks
-- its row by the primary key and writes it with ON CONFLICT's probe, as
-- batch.allow's does.
--
-- The answer is one row of arrays, one element per key decided: the key,
-- the calls admitted, the state the statement decided on (zeros where it
-- is NULL, with a flag that says so, as arrays of arrays must be of one
-- shape), the row's expires_at in µs and the time in µs it decided at;
-- the last column evaluates the admitting branches' setting. The limiter
-- computes each call's Decision from them (arith.Evaluate and arith.Admit).
--
-- With per-key limits (Config.Overrides), each key's are read first, as
-- overrides.allow reads them, and the answer has their rates and bursts. A
-- key whose row of the overrides table the limits cannot use, or with no
-- room for a call however long it waits, gets no answer: its callers'
-- own statements report why.
--
-- Placeholders: table; setting, as in key_row.allow; wait and patience, as
-- in batch.allow; state, the state column t.state as the statement reads
-- it (arith.Shaped); width, the length of a state; guard, whether one call
-- (c.n units) fits c (state, tat, now); refuses, whether c refuses one;
-- count, how many of x's calls fit (x.calls of x.n units), and new_state
-- and new_expires, x's row once g.granted of them are admitted
-- (arith.BatchSQL); own, the LATERAL join that reads the key's own limits
-- (columns of req), or nothing; own_cols, the columns of them that guard
-- reads, from c; own_d and own_c, their rates and bursts in the answer,
-- from d and c, and own_agg, aggregated; each of the own_ with a leading
-- comma, or nothing.
{{define "batch.general"}}
WITH req AS (
    SELECT * FROM unnest($2::text[], $3::bigint[], $5::bigint[]) AS r(key, n, calls){{.own}}
    WHERE {{.patience}}
), current AS (
    SELECT r.*, c.ctid, c.state, c.tat, c.now FROM req AS r CROSS JOIN LATERAL (
        SELECT t.ctid, {{.state}} AS state, (extract(epoch FROM t.expires_at) * 1000000)::bigint AS tat,
            (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now
        FROM {{.table}} AS t WHERE t.namespace = $1 AND t.key = r.key
        OFFSET 0
    ) AS c
), locked AS (
    SELECT c.key, l.ctid, l.state, (extract(epoch FROM l.expires_at) * 1000000)::bigint AS tat,
        (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now, false AS fresh
    FROM current AS c CROSS JOIN LATERAL (
        SELECT t.ctid, {{.state}} AS state, t.expires_at FROM {{.table}} AS t
        WHERE {{if .wait}}t.namespace = $1 AND t.key = c.key{{else}}t.ctid = c.ctid{{end}}
          AND (SELECT {{.guard}} FROM (SELECT {{.state}} AS state, (extract(epoch FROM t.expires_at) * 1000000)::bigint AS tat,
               (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now, c.n{{.own_cols}}) AS c)
        FOR UPDATE OF t{{if not .wait}} SKIP LOCKED{{end}}
    ) AS l
    WHERE {{.guard}}
), first AS (
    SELECT r.key, pg_try_advisory_xact_lock($4::integer, hashtext(r.key)) AS got FROM req AS r
    WHERE NOT EXISTS (SELECT FROM current AS c WHERE c.key = r.key)
    ORDER BY r.key
), found AS (
    SELECT r.*, s.ctid, s.state, s.tat, s.now, s.fresh FROM req AS r JOIN (
        SELECT * FROM locked
        UNION ALL
        SELECT f.key, NULL::tid, NULL::bigint[], NULL::bigint, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, true
        FROM first AS f WHERE f.got
    ) AS s ON s.key = r.key
), decided AS (
    SELECT x.*, g.granted, {{.new_state}} AS new_state, {{.new_expires}} AS new_expires
    FROM found AS x CROSS JOIN LATERAL (SELECT {{.count}} AS granted) AS g
    WHERE g.granted > 0
), updated AS (
{{- if .wait}}
    INSERT INTO {{.table}} AS t (namespace, key, state, expires_at)
    SELECT $1, d.key, d.new_state, timestamptz 'epoch' + d.new_expires * interval '1 microsecond' FROM decided AS d
    WHERE NOT d.fresh
    ON CONFLICT (namespace, key) DO UPDATE SET state = excluded.state, expires_at = excluded.expires_at
{{- else}}
    UPDATE {{.table}} AS t SET state = d.new_state, expires_at = timestamptz 'epoch' + d.new_expires * interval '1 microsecond'
    FROM decided AS d
    WHERE t.ctid = d.ctid AND NOT d.fresh
{{- end}}
    RETURNING t.key
), inserted AS (
    INSERT INTO {{.table}} AS t (namespace, key, state, expires_at)
    SELECT $1, d.key, d.new_state, timestamptz 'epoch' + d.new_expires * interval '1 microsecond' FROM decided AS d
    WHERE d.fresh
    ORDER BY d.key
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING t.key
), answer AS (
    SELECT d.key, d.granted, d.state, d.tat, d.now{{.own_d}}, {{.setting}} AS setting
    FROM decided AS d JOIN (SELECT * FROM updated UNION ALL SELECT * FROM inserted) AS w ON w.key = d.key
    UNION ALL
    SELECT c.key, 0, c.state, c.tat, c.now{{.own_c}}, NULL::text FROM current AS c
    WHERE {{.refuses}}
)
SELECT array_agg(key), array_agg(granted), array_agg(coalesce(state, array_fill(0::bigint, ARRAY[{{.width}}]))),
    array_agg(state IS NOT NULL), array_agg(tat), array_agg(now), max(setting){{.own_agg}}
FROM answer
{{end}}
