-- The hierarchical statement (pglimit.AllowAll) charges n units to several
-- keys, each under its own limiter (table, namespace, limits, per-key
-- limits), all or none, in one statement.
--
-- It first decides every level on its row as the statement's snapshot sees
-- it (guard), as the single-key general statement does: if a level that
-- counts refuses there, that is the answer, with no lock and no write.
-- Otherwise it locks the levels' rows and decides again on the latest
-- versions. The levels come in one global
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

-- hierarchy.lock is level i's lock, taken only if the snapshot's levels
-- fit (guard), after the previous level's lock (after, empty for the
-- first). Placeholders: i, table, ns and key (its parameters), after.
{{define "hierarchy.lock"}}l{{.i}} AS MATERIALIZED (
    SELECT t.state, t.expires_at FROM {{.table}} AS t
    WHERE (SELECT g.fits FROM guard AS g) AND {{.after}}t.namespace = {{.ns}} AND t.key = {{.key}}
    FOR UPDATE
){{end}}

-- hierarchy.snapshot joins level i's row as the snapshot sees it, r<i>,
-- if it has one. Placeholders: i, table, ns, key.
{{define "hierarchy.snapshot"}}LEFT JOIN {{.table}} AS r{{.i}} ON r{{.i}}.namespace = {{.ns}} AND r{{.i}}.key = {{.key}}{{end}}

-- hierarchy.seen is level i's row r<i> as the guard reads it: found, its
-- state (of its limits' shape, else NULL) and its expires_at in µs.
-- Placeholders: i, state (arith.Shaped of r<i>.state).
{{define "hierarchy.seen"}}(r{{.i}}.key IS NOT NULL)::int::bigint AS f{{.i}}, {{.state}} AS s{{.i}},
        (extract(epoch FROM r{{.i}}.expires_at) * 1000000)::bigint AS tat{{.i}}{{end}}

-- hierarchy.values is level i's row as the decision reads it: found, its
-- state (of its limits' shape, else NULL) and its expires_at in µs.
-- Placeholders: i, state (arith.Shaped of l.state).
{{define "hierarchy.values"}}(SELECT count(*) FROM l{{.i}}) AS f{{.i}},
        (SELECT {{.state}} FROM l{{.i}} AS l) AS s{{.i}},
        (SELECT (extract(epoch FROM l.expires_at) * 1000000)::bigint FROM l{{.i}} AS l) AS tat{{.i}}{{end}}

-- hierarchy.update writes level i's new state if the statement admits.
-- Placeholders: i, table, ns, key, returning; claimed, empty, or with a
-- decision id the condition that the statement claimed it.
{{define "hierarchy.update"}}u{{.i}} AS (
    UPDATE {{.table}} AS t
    SET state = d.ns{{.i}}, expires_at = timestamptz 'epoch' + d.ne{{.i}} * interval '1 microsecond'
    FROM decided AS d
    WHERE t.namespace = {{.ns}} AND t.key = {{.key}} AND d.go AND d.a{{.i}}{{.claimed}}
    RETURNING 1{{.returning}}
){{end}}

-- hierarchy.claim stores the decision id of an admission for level i, in
-- its namespace's ids table, as the general statement's id row of
-- AllowAll's mode (3). The first level's claim (conflict, DO NOTHING)
-- decides: a concurrent statement with the same id waits for it, and then
-- writes nothing. The other levels' claims follow it (after) and have no
-- ON CONFLICT: an id another decision holds in a level's namespace fails
-- the statement, which then wrote nothing. Placeholders: i, ids, ns, key,
-- id, n, retention (µs, a constant), conflict, after.
{{define "hierarchy.claim"}}c{{.i}} AS (
    INSERT INTO {{.ids}} (namespace, id, key, n, state, tat, now, expires_at, mode)
    SELECT {{.ns}}, {{.id}}, {{.key}}, {{.n}}, d.s{{.i}}, d.tat{{.i}}, d.now,
        timestamptz 'epoch' + (d.now + {{.retention}}) * interval '1 microsecond', 3
    FROM decided AS d WHERE d.go{{.after}}
    {{.conflict}}RETURNING 1
){{end}}

-- hierarchy.allow assembles the statement. Placeholders: snapshot, the
-- levels' hierarchy.snapshot; seen, their hierarchy.seen; own_seen, the
-- per-key limits read for them (as in decisions, each after a comma);
-- fits, whether the levels that count admit there; locks, the levels' hierarchy.lock, in order;
-- last, the last lock's name; values, their hierarchy.values; own, the
-- LATERAL joins of per-key limits; decisions, each level's admits (a<i>),
-- new state (ns<i>) and new expires_at (ne<i>); go, whether the statement
-- admits; updates, the levels' hierarchy.update; written, how many rows
-- they wrote; answer and seen_answer, the answer's columns per level, of
-- d and of g; setting, the extra column of an admission
-- (synchronous_commit, or the writer's id in a transaction); claims, with
-- a decision id, the levels' hierarchy.claim, each followed by a comma,
-- taken and not_taken, the answer's column saying that the id was taken
-- by another decision (after a comma), else all three empty. The answer's
-- first column says whether the rows were locked: if not, the guard
-- refused, and the rest is the snapshot's.
{{define "hierarchy.allow"}}
WITH seen AS MATERIALIZED (
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now, {{.seen}}
    FROM (SELECT) AS one
    {{.snapshot}}
), guard AS MATERIALIZED (
    SELECT g.*{{.own_seen}}, {{.fits}} AS fits
    FROM seen AS g{{.own}}
), {{.locks}}, stamp AS MATERIALIZED (
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now
    WHERE (SELECT count(*) FROM {{.last}}) >= 0
), x AS MATERIALIZED (
    SELECT stamp.now, {{.values}}
    FROM stamp
), decided AS (
    SELECT x.*, {{.decisions}}, {{.go}} AS go
    FROM x{{.own}}
), {{.claims}}{{.updates}}
SELECT true, d.go, d.now, CASE WHEN d.go THEN {{.setting}} END, {{.written}}{{.taken}}, {{.answer}}
FROM decided AS d WHERE (SELECT g.fits FROM guard AS g)
UNION ALL
SELECT false, false, g.now, NULL, 0{{.not_taken}}, {{.seen_answer}}
FROM guard AS g WHERE NOT g.fits
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
