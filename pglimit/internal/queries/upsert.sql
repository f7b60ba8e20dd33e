-- The statements of a single GCRA limit (a cooldown is one) on the Upsert
-- and NoWait tables, and Reset.
--
-- key_row.allow decides a request of the key and writes it, or inserts the
-- row of a key never seen, in one statement with one write: an INSERT ...
-- ON CONFLICT DO UPDATE. current reads the key's row as the snapshot sees
-- it, without a lock. If it refuses the request, that row is the answer: a
-- refusal takes no lock and writes nothing, so on a hot key it costs a
-- round trip, not a WAL flush (the textbook upsert, which sends every
-- request to ON CONFLICT, locks and WAL-logs the row even when its WHERE
-- refuses). If it fits, or the key has no row, the INSERT's conflict
-- finds the key's latest row version, locks it, waiting for any holder,
-- and only then evaluates its WHERE (the guard) and its SET on that
-- version, at a clock_timestamp() read after the wait: a concurrent
-- admission's write is seen, and a holder that rolled back leaves the row
-- as it was, with no value computed before the wait. So two requests can
-- never both see room.
--
-- expires_at is the limit's theoretical arrival time (TAT); a request of n
-- units fits when TAT <= now + tau ($5 = (Burst - n) * T µs), and it moves
-- the TAT to max(TAT, now) + $3 ($3 = n * T µs). For a cooldown, T is the
-- cooldown and tau is 0. The answer's now is the clock of the write
-- (TAT - $3 when the row was idle), or a reading just after it.
--
-- A row the snapshot saw but a concurrent Reset or cleanup deleted before
-- the lock leaves no conflict, and the INSERT writes the value a request
-- that fitted offers, a placeholder: TAT 'epoch', a key with room,
-- which answers nothing, so the caller runs the statement again and then
-- decides on the clock of that run; current never reads a placeholder as
-- a row. A first request takes a transaction-level advisory lock on the
-- key (table, namespace and key: $4 hashes the first two) before it reads
-- the clock for its row, so a concurrent first request makes it wait
-- before, not after, that reading, and a row inserted after a wait never
-- carries a time from before it; the lock is taken only for a key with no
-- row, never on the refusal path.
--
-- The answer (admitted, TAT µs, now µs, setting): the row the write
-- returned, else a refusal while the snapshot's row does not fit, else
-- no row at all: the key changed after the snapshot (a concurrent
-- admission that left no room, Reset or cleanup), and the caller runs the
-- statement again on a fresh one.
--
-- Placeholders: table; patience, a condition evaluated before the write's
-- lock (true, or nowait.condition for NoWait); setting, the column the
-- admitting branch returns (NULL::text, the set_config of asynchronous
-- commit, or setting.xact_written in a caller's transaction); returning,
-- what the write returns besides (empty, or returning.xact for
-- setting.xact_written). $1 namespace, $2 key, $3 n*T µs, $4 the key's
-- lock class, $5 tau µs.
{{define "key_row.allow"}}
WITH current AS (
    SELECT t.expires_at, clock_timestamp() AS now FROM {{.table}} AS t
    WHERE t.namespace = $1 AND t.key = $2 AND t.expires_at > timestamptz 'epoch'
), first AS (
    SELECT pg_advisory_xact_lock($4::integer, hashtext($2))
    WHERE NOT EXISTS (SELECT FROM current)
), written AS (
    INSERT INTO {{.table}} AS t (namespace, key, expires_at)
    SELECT $1, $2, timestamptz 'epoch' FROM current AS c
    WHERE c.expires_at <= c.now + $5::bigint * interval '1 microsecond' AND {{.patience}}
    UNION ALL
    SELECT $1, $2, clock_timestamp() + $3::bigint * interval '1 microsecond' FROM first
    WHERE {{.patience}}
    ON CONFLICT (namespace, key) DO UPDATE
    SET expires_at = greatest(t.expires_at, clock_timestamp()) + $3::bigint * interval '1 microsecond'
    WHERE t.expires_at <= clock_timestamp() + $5::bigint * interval '1 microsecond'
    RETURNING t.expires_at, least(clock_timestamp(), t.expires_at - $3::bigint * interval '1 microsecond') AS now{{.returning}}
)
SELECT true, (extract(epoch FROM w.expires_at) * 1000000)::bigint, (extract(epoch FROM w.now) * 1000000)::bigint, {{.setting}}
FROM written AS w WHERE w.expires_at > timestamptz 'epoch'
UNION ALL
SELECT false, (extract(epoch FROM c.expires_at) * 1000000)::bigint, (extract(epoch FROM c.now) * 1000000)::bigint, NULL::text
FROM current AS c WHERE c.expires_at > c.now + $5::bigint * interval '1 microsecond'
{{end}}

-- upsert.lock is Upsert's lock clause, which waits for the row as long as
-- the decision's timeout lets it.
{{define "upsert.lock"}}FOR UPDATE{{end}}

-- NoWait waits at most 20 ms (nowait.condition) for a row another decision
-- holds, long enough for a concurrent admission to commit, too short to
-- queue behind a caller's transaction. A lock not granted by then raises
-- lock_not_available (55P03), and the request is refused.
--
-- nowait.lock ends the WHERE clause of a NoWait lock: a condition that is
-- always true sets lock_timeout for the statement's transaction, evaluated
-- on the row before its lock is requested. nowait.condition is that
-- condition alone, which key_row.allow and the batch statement evaluate
-- before their first lock. pglimit's noWaitPatience says the same 20 ms.
{{define "nowait.lock"}}AND {{template "nowait.condition"}}
    FOR UPDATE{{end}}
{{define "nowait.condition"}}set_config('lock_timeout', '20ms', true) IS NOT NULL{{end}}

-- reset is Reset on the Upsert, NoWait and Range tables: it deletes the
-- key's rows and, in the same transaction, tells every instance's
-- Invalidator to forget the key ($3 is the lock class, naming table and
-- namespace). The notification is delivered at commit, and only if it
-- commits. Placeholders: table, channel (the Invalidator's).
{{define "reset"}}
WITH deleted AS (DELETE FROM {{.table}} WHERE namespace = $1 AND key = $2)
SELECT pg_notify('{{.channel}}', $3::integer || ':' || $2)
{{end}}
