-- The hierarchical statement (pglimit.AllowAll) charges n units to several
-- keys, each under its own limiter (table, namespace, limits, per-key
-- limits), all or none, in one statement. The levels come in one global
-- order (table, namespace, key), whatever order the caller named them in,
-- and their rows are locked in that order, one after the other: l<i+1>'s
-- scan starts only once l<i>'s lock is held (its one-time filter reads
-- l<i>), so two such statements never wait for each other in a cycle. A
-- batch skips a locked row and a single-key statement locks one, so
-- neither closes a cycle with them either.
--
-- The clock is read once every lock is held, and each level's decision is
-- its limiter's own (arith.DecisionSQL) on the row version it locked. Only
-- if every level that counts admits (a limiter in shadow mode does not
-- count) is any row written, each by its own UPDATE. A level whose key
-- has no row yet is answered as missing (found 0) and writes nothing: the
-- caller inserts a blank row for it, which means the same as none, and
-- runs the statement again.

-- hierarchy.lock is level i's lock: $ns and $key its parameters, after
-- the previous level's lock (prev, empty for the first). Placeholders:
-- i, table, ns, key, after.
{{define "hierarchy.lock"}}l{{.i}} AS MATERIALIZED (
    SELECT t.state, t.expires_at FROM {{.table}} AS t
    WHERE {{.after}}t.namespace = {{.ns}} AND t.key = {{.key}}
    FOR UPDATE
){{end}}

-- hierarchy.values is level i's row as the decision reads it: found, its
-- state (of its limits' shape, else NULL) and its expires_at in µs.
-- Placeholders: i, state (arith.Shaped of l.state).
{{define "hierarchy.values"}}(SELECT count(*) FROM l{{.i}}) AS f{{.i}},
        (SELECT {{.state}} FROM l{{.i}} AS l) AS s{{.i}},
        (SELECT (extract(epoch FROM l.expires_at) * 1000000)::bigint FROM l{{.i}} AS l) AS tat{{.i}}{{end}}

-- hierarchy.update writes level i's new state if the statement admits.
-- Placeholders: i, table, ns, key, returning.
{{define "hierarchy.update"}}u{{.i}} AS (
    UPDATE {{.table}} AS t
    SET state = d.ns{{.i}}, expires_at = timestamptz 'epoch' + d.ne{{.i}} * interval '1 microsecond'
    FROM decided AS d
    WHERE t.namespace = {{.ns}} AND t.key = {{.key}} AND d.go AND d.a{{.i}}
    RETURNING 1{{.returning}}
){{end}}

-- hierarchy.allow assembles the statement. Placeholders: locks, the
-- levels' hierarchy.lock, in order; last, the last lock's name; values,
-- their hierarchy.values; own, the LATERAL joins of per-key limits;
-- decisions, each level's admits (a<i>), new state (ns<i>) and new
-- expires_at (ne<i>); go, whether the statement admits; updates, the
-- levels' hierarchy.update; written, how many rows they wrote; answer,
-- the answer's columns per level; setting, the extra column of an
-- admission (synchronous_commit, or the writer's id in a transaction).
{{define "hierarchy.allow"}}
WITH {{.locks}}, stamp AS MATERIALIZED (
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now
    WHERE (SELECT count(*) FROM {{.last}}) >= 0
), x AS MATERIALIZED (
    SELECT stamp.now, {{.values}}
    FROM stamp
), decided AS (
    SELECT x.*, {{.decisions}}, {{.go}} AS go
    FROM x{{.own}}
), {{.updates}}
SELECT d.go, d.now, CASE WHEN d.go THEN {{.setting}} END, {{.written}}, {{.answer}}
FROM decided AS d
{{end}}

-- hierarchy.xact is the answer's extra column in a caller's transaction:
-- setting.xact of the rows the levels' updates wrote (writes), all by one
-- subtransaction, the statement's savepoint.
{{define "hierarchy.xact"}}(SELECT (top.id + (w.xmin::text::bigint - top.id % 4294967296 + 4294967296) % 4294967296)::text
    FROM ({{.writes}} LIMIT 1) AS w, (SELECT pg_current_xact_id()::text::bigint AS id) AS top){{end}}

-- hierarchy.blank inserts the row of a key that has none, holding no
-- state: a key with such a row stands as one without. $1 namespace, $2
-- key. Placeholder: table.
{{define "hierarchy.blank"}}
INSERT INTO {{.table}} (namespace, key, expires_at) VALUES ($1, $2, now())
ON CONFLICT (namespace, key) DO NOTHING
RETURNING 1
{{end}}
