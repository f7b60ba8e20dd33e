-- The statements of a single GCRA limit (a cooldown is one) on the Upsert
-- and NoWait tables, and Reset.
--
-- upsert.allow locks the key's row if it admits the request, then updates
-- it, or inserts it for a key never seen, in one statement. The guard keeps
-- concurrent requests apart: a FOR UPDATE that finds the row locked waits
-- for the holder and re-checks the guard against the row it left, so two
-- requests can never both see room. A refusal matches no row, so it takes
-- no lock and writes nothing: on a hot key it costs a round trip, not a WAL
-- flush (INSERT ... ON CONFLICT DO UPDATE, the textbook form, locks and
-- WAL-logs the row even when its WHERE refuses).
--
-- expires_at is the limit's theoretical arrival time (TAT); a request of n
-- units fits when TAT <= now + tau ($5 = (Burst - n) * T µs), and it moves
-- the TAT to max(TAT, now) + $3 ($3 = n * T µs). For a cooldown, T is the
-- cooldown and tau is 0.
--
-- Both the guard and the new value read clock_timestamp() when the row is
-- written, after any wait for the lock: the UPDATE's values are computed
-- only once locked has its row (a plain guarded UPDATE computes them before
-- it waits, and keeps them if the holder rolls back), and
-- statement_timestamp() would date the units from before the wait.
--
-- Placeholders: table; setting, the column the admitting branches return
-- (NULL::text, the set_config of asynchronous commit, or setting.xact in a
-- caller's transaction); returning, what the writes return besides (empty,
-- or returning.xact for setting.xact). $1 namespace,
-- $2 key, $3 n*T µs, $4 the key's lock class, $5 tau µs.
{{define "upsert.allow"}}
WITH locked AS (
    SELECT t.expires_at FROM {{.table}} AS t
    WHERE t.namespace = $1 AND t.key = $2 AND t.expires_at <= clock_timestamp() + $5::bigint * interval '1 microsecond'
    {{template "upsert.lock"}}
),{{template "key_row_tail" .}}
{{end}}

-- nowait.allow differs from upsert.allow only in its lock: it waits at most
-- 20 ms (nowait.lock) for a row another decision holds, long enough for a
-- concurrent admission to commit, too short to queue behind a caller's
-- transaction. A lock not granted by then raises lock_not_available
-- (55P03), and the request is refused.
{{define "nowait.allow"}}
WITH locked AS (
    SELECT t.expires_at FROM {{.table}} AS t
    WHERE t.namespace = $1 AND t.key = $2 AND t.expires_at <= clock_timestamp() + $5::bigint * interval '1 microsecond'
    {{template "nowait.lock"}}
),{{template "key_row_tail" .}}
{{end}}

-- upsert.lock is Upsert's lock clause, which waits for the row as long as
-- the decision's timeout lets it.
{{define "upsert.lock"}}FOR UPDATE{{end}}

-- nowait.lock ends the WHERE clause of a NoWait lock: a condition that is
-- always true sets lock_timeout for the statement's transaction, evaluated
-- on the row before its lock is requested. nowait.condition is that
-- condition alone, which the batch statement sets before its first lock.
-- The engine's noWaitPatience says the same 20 ms.
{{define "nowait.lock"}}AND {{template "nowait.condition"}}
    FOR UPDATE{{end}}
{{define "nowait.condition"}}set_config('lock_timeout', '20ms', true) IS NOT NULL{{end}}

-- key_row_tail ends upsert.allow and nowait.allow, which begin with locked,
-- the key's row once locked if the request fits: its update, the key's row
-- as this statement's snapshot sees it, the insertion of a key it does not
-- see, and the answer.
--
-- Each part reads the key's row only when locked leaves it something to
-- do (the EXISTS conditions, evaluated once, before the part's lookup): an
-- admission reads the row to lock it and to update it, a refusal to lock
-- it (the guard refuses) and for current. At 100,000 keys that is 11.5
-- buffer hits per admission and 8 per refusal, where every part looking
-- the key up took 15.5 and 12. The update cannot go through the locked
-- row's ctid as batch.allow's does: after a wait for the lock the row has
-- moved to a version this statement's snapshot cannot see, and only a
-- lookup by the key follows it there.
--
-- A first request takes a transaction-level advisory lock on the key
-- (table, namespace and key: $4 hashes the first two) before it stamps its
-- row: a concurrent first request (in a caller's open transaction, say)
-- then makes it wait before, not after, it reads the clock, so a row
-- inserted after a wait never carries a time from before it. The lock is
-- taken only for a key with no row, never on the refusal path.
--
-- The answer (admitted, TAT µs, now µs, setting): the row one of them
-- wrote, else a refusal while the snapshot's row does not fit the request,
-- else no row at all: the key changed after the snapshot (a concurrent
-- admission, Reset or cleanup), and the caller runs the statement again on
-- a fresh one.
{{define "key_row_tail"}}
stamp AS (
    SELECT l.expires_at, clock_timestamp() AS now FROM locked AS l
), updated AS (
    UPDATE {{.table}} AS t
    SET expires_at = greatest(s.expires_at, s.now) + $3::bigint * interval '1 microsecond'
    FROM stamp AS s
    WHERE t.namespace = $1 AND t.key = $2 AND EXISTS (SELECT FROM locked)
    RETURNING t.expires_at, s.now{{.returning}}
), current AS (
    SELECT t.expires_at, clock_timestamp() AS now FROM {{.table}} AS t
    WHERE t.namespace = $1 AND t.key = $2
), first AS (
    SELECT pg_advisory_xact_lock($4::integer, hashtext($2))
    WHERE NOT EXISTS (SELECT FROM locked) AND NOT EXISTS (SELECT FROM current)
), fresh AS (
    SELECT clock_timestamp() AS now FROM first
), inserted AS (
    INSERT INTO {{.table}} (namespace, key, expires_at)
    SELECT $1, $2, f.now + $3::bigint * interval '1 microsecond' FROM fresh AS f
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING expires_at{{.returning}}
)
SELECT true, (extract(epoch FROM expires_at) * 1000000)::bigint, (extract(epoch FROM now) * 1000000)::bigint, {{.setting}}
FROM updated
UNION ALL
SELECT true, (extract(epoch FROM i.expires_at) * 1000000)::bigint, (extract(epoch FROM f.now) * 1000000)::bigint, {{.setting}}
FROM inserted AS i, fresh AS f
UNION ALL
SELECT false, (extract(epoch FROM expires_at) * 1000000)::bigint, (extract(epoch FROM now) * 1000000)::bigint, NULL::text
FROM current
WHERE expires_at > now + $5::bigint * interval '1 microsecond' AND NOT EXISTS (SELECT FROM updated)
{{end}}

-- reset is Reset on the Upsert, NoWait and Range tables: it deletes the
-- key's rows and, in the same transaction, tells every instance's
-- Invalidator to forget the key ($3 is the lock class, naming table and
-- namespace). The notification is delivered at commit, and only if it
-- commits. Placeholders: table, channel (the Invalidator's).
{{define "reset"}}
WITH deleted AS (DELETE FROM {{.table}} WHERE namespace = $1 AND key = $2)
SELECT pg_notify('{{.channel}}', $3::integer || ':' || $2)
{{end}}
