-- batch.allow decides many keys of a single GCRA limit at once: $2 the
-- keys, $3 each key's n*T, $6 how many calls of n units ask for it, $9 T
-- and $10 Burst*T, in µs. It is key_row.allow's decision over a set of
-- keys, where each key admits as many of its calls, in order, as fit, and
-- then leases up to $7 more units, the first of them slotted no
-- earlier than $8 µs after the statement's clock reading, as many as fit
-- with the key's TAT at most $11 µs past where a call could be admitted
-- now (the lease's later units become usable later). $5 is each key's
-- tolerance: the most its TAT may exceed now for anything to fit
-- (Burst*T - n*T, or Burst*T - T + $11 when it asks for a lease).
-- It differs from the single-key statement in what it does not do:
--
-- It never waits for a lock, so one slow key cannot hold back the others
-- and no two statements can wait for each other: a row locked by a
-- concurrent decision is skipped (SKIP LOCKED), and a new key whose
-- advisory lock is held is passed over (pg_try_advisory_xact_lock). Such
-- keys, and keys that changed after the snapshot, get no answer row; their
-- callers decide them with the limiter's own statement, which waits (Upsert)
-- or refuses (NoWait) as it always does.
--
-- It reads each key once. current looks the key up by the primary key,
-- keeping the row's ctid, and decides a refusal on what it read; a key
-- that fits is locked and written through that ctid (Tid Scans), one heap
-- page each, where a lookup reads the index from its root. The row it
-- locks is the very version current read: a row another statement updated
-- after the snapshot has moved, and the lock's recheck (EvalPlanQual)
-- rejects the moved version, whose ctid is not the one asked for, so the
-- key goes unanswered. The write, through the ctid it locked, can only
-- find that version. (Minor releases older than the fix that gave Tid
-- Scans this recheck, back-patched to 13, lock the moved version; the
-- write through its ctid then finds nothing, since the snapshot cannot see
-- it, and the key goes unanswered all the same, with nothing written.)
--
-- With wait set, the statement decides one key that a batch skipped, and
-- waits for its row's lock, after which the row has usually moved: so it
-- locks the key's row by the primary key, which follows the row to its
-- latest version, and writes it with INSERT ... ON CONFLICT DO UPDATE,
-- whose probe finds that version too (the statement holds its lock
-- already, so the conflict is certain).
--
-- Its plan cannot degrade as the table grows: every access to the table is
-- one key's lookup by the primary key or by ctid, in a LATERAL subquery
-- per key (which the planner cannot turn into a join that scans the
-- namespace), or ON CONFLICT's probe; the write joins the decided rows to
-- the table by ctid, which the generic plan made on an empty, never
-- analysed table does as a Tid Scan per row. A plain join on the key, or
-- key = ANY($2), lets such a plan scan the whole namespace for ever after
-- (TestPlansReachKeysByIndex, which runs every part of the statement).
--
-- A refusal, as in the single-key statement, takes no lock and writes
-- nothing. A batch of refusals writes nothing.
--
-- The answer is one row of arrays (key, calls admitted, TAT µs after them,
-- now µs, units leased, the TAT µs the lease starts from, the transaction
-- that wrote the row or 0), so the statement runs through QueryRow like
-- every other; the last column evaluates the admitting branches' setting.
-- locked reads the clock once the row is locked, as key_row.allow's
-- write does.
--
-- Placeholders: table; setting, as in key_row.allow; wait, empty for the
-- batch, true for the statement that waits for one key; patience, true or
-- nowait.condition for the statement that waits.
{{define "batch.allow"}}
WITH req AS (
    SELECT r.key, r.nt, r.tau, r.calls, r.want, r.ahead
    FROM unnest($2::text[], $3::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[]) AS r(key, nt, tau, calls, want, ahead)
    WHERE {{.patience}}
), current AS (
    SELECT r.key, r.nt, r.tau, r.calls, r.want, r.ahead, c.ctid, c.tat, c.now FROM req AS r CROSS JOIN LATERAL (
        SELECT t.ctid, (extract(epoch FROM t.expires_at) * 1000000)::bigint AS tat,
            (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now
        FROM {{.table}} AS t WHERE t.namespace = $1 AND t.key = r.key
        OFFSET 0
    ) AS c
), locked AS (
    SELECT c.key, l.ctid, c.nt, c.calls, c.want, c.ahead, (extract(epoch FROM l.expires_at) * 1000000)::bigint AS tat,
        (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now, false AS fresh
    FROM current AS c CROSS JOIN LATERAL (
        SELECT t.ctid, t.expires_at FROM {{.table}} AS t
        WHERE {{if .wait}}t.namespace = $1 AND t.key = c.key{{else}}t.ctid = c.ctid{{end}}
            AND t.expires_at <= clock_timestamp() + c.tau * interval '1 microsecond'
        FOR UPDATE OF t{{if not .wait}} SKIP LOCKED{{end}}
    ) AS l
    WHERE c.tat <= c.now + c.tau
), first AS (
    SELECT r.key, r.nt, r.calls, r.want, r.ahead, pg_try_advisory_xact_lock($4::integer, hashtext(r.key)) AS got FROM req AS r
    WHERE NOT EXISTS (SELECT FROM current AS c WHERE c.key = r.key)
    ORDER BY r.key
), found AS (
    SELECT * FROM locked
    UNION ALL
    SELECT f.key, NULL::tid, f.nt, f.calls, f.want, f.ahead, n.now, n.now, true FROM first AS f
    CROSS JOIN LATERAL (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now) AS n
    WHERE f.got
), decided AS (
    SELECT s.key, s.ctid, s.now, s.fresh, g.granted, g.after AS tat, k.leased, k.start,
        CASE WHEN k.leased > 0 THEN k.start + k.leased * $9 ELSE g.after END AS new_tat
    FROM found AS s
    CROSS JOIN LATERAL (
        SELECT g.granted, greatest(s.tat, s.now) + g.granted * s.nt AS after FROM (
            SELECT least(s.calls, greatest((s.now + $10 - greatest(s.tat, s.now)) / s.nt, 0)) AS granted
        ) AS g
    ) AS g
    CROSS JOIN LATERAL (
        SELECT k.start, least(s.want, greatest((s.now + $10 + $11 - k.start) / $9, 0)) AS leased FROM (
            SELECT greatest(g.after, s.now + s.ahead) AS start
        ) AS k
    ) AS k
    WHERE g.granted > 0 OR k.leased > 0
), updated AS (
{{- if .wait}}
    INSERT INTO {{.table}} AS t (namespace, key, expires_at)
    SELECT $1, d.key, timestamptz 'epoch' + d.new_tat * interval '1 microsecond' FROM decided AS d
    WHERE NOT d.fresh
    ON CONFLICT (namespace, key) DO UPDATE SET expires_at = excluded.expires_at
{{- else}}
    UPDATE {{.table}} AS t SET expires_at = timestamptz 'epoch' + d.new_tat * interval '1 microsecond'
    FROM decided AS d
    WHERE t.ctid = d.ctid AND NOT d.fresh
{{- end}}
    RETURNING t.key, t.xmin
), inserted AS (
    INSERT INTO {{.table}} AS t (namespace, key, expires_at)
    SELECT $1, d.key, timestamptz 'epoch' + d.new_tat * interval '1 microsecond' FROM decided AS d
    WHERE d.fresh
    ORDER BY d.key
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING t.key, t.xmin
), answer AS (
    SELECT d.key, d.granted, d.tat, d.now, d.leased, d.start, w.xmin::text::bigint AS xid, {{.setting}} AS setting
    FROM decided AS d JOIN (SELECT * FROM updated UNION ALL SELECT * FROM inserted) AS w ON w.key = d.key
    UNION ALL
    SELECT c.key, 0, c.tat, c.now, 0, 0, 0, NULL::text FROM current AS c
    WHERE c.tat > c.now + c.tau
)
SELECT array_agg(key), array_agg(granted), array_agg(tat), array_agg(now), array_agg(leased), array_agg(start), array_agg(xid), max(setting)
FROM answer
{{end}}

-- batch.give_back moves key $2's TAT back by $3 µs, the units of an idle
-- lease's last run, if the row is still as the statement that leased them
-- left it: its TAT is $4 µs and transaction $5 wrote it. Any other write
-- since, or a Reset, makes it change nothing.
{{define "batch.give_back"}}
UPDATE {{.table}} AS t SET expires_at = t.expires_at - $3 * interval '1 microsecond'
WHERE t.namespace = $1 AND t.key = $2
    AND t.expires_at = timestamptz 'epoch' + $4 * interval '1 microsecond'
    AND t.xmin::text::bigint = $5
{{end}}
