-- The statements of Semaphore. Placeholder: table, the slots table.
--
-- slots.acquire takes a slot of key $2 in namespace $1 below $3 for $4 µs:
-- the lowest whose lease ended, skipping those another acquirer has
-- locked, or else the lowest slot number that has no row and that no
-- acquirer in flight is inserting (each inserter holds a transaction
-- advisory lock on its slot number, $5 seeding the hash), so that an
-- acquirer never waits for another. It returns the slot taken (NULL for
-- none), its holder and lease end, then how many slots it saw held and
-- when the first of their leases ends, and the time, read once from the
-- clock (not the transaction's start, which in a caller's transaction may
-- be long past). The counts come from
-- the statement's snapshot, which sees neither its own write nor
-- acquisitions in flight: a refusal that saw fewer than $3 held lost a
-- race, and is tried again.
{{define "slots.acquire"}}
WITH clock AS (
    SELECT clock_timestamp() AS now
){{.queue}}, free AS (
    SELECT s.slot FROM {{.table}} AS s, clock
    WHERE s.namespace = $1 AND s.key = $2 AND s.slot < $3 AND s.expires_at <= clock.now{{.turn}}
    ORDER BY s.slot
    LIMIT 1
    FOR UPDATE OF s SKIP LOCKED
), reused AS (
    UPDATE {{.table}} AS s
    SET holder = gen_random_uuid(), expires_at = clock.now + $4 * interval '1 microsecond'
    FROM free, clock
    WHERE s.namespace = $1 AND s.key = $2 AND s.slot = free.slot
    RETURNING s.slot, s.holder, s.expires_at
), added AS (
    INSERT INTO {{.table}} (namespace, key, slot, holder, expires_at)
    SELECT $1, $2, g, gen_random_uuid(), clock.now + $4 * interval '1 microsecond'
    FROM (SELECT g FROM generate_series(0, $3 - 1) AS g
          WHERE {{.turn_first}}CASE WHEN EXISTS (SELECT FROM reused)
                       OR EXISTS (SELECT FROM {{.table}} AS o WHERE o.namespace = $1 AND o.key = $2 AND o.slot = g)
                     THEN false
                     ELSE pg_try_advisory_xact_lock(hashtextextended($1 || '/' || $2 || '/' || g, $5))
                END
          LIMIT 1) AS candidate, clock
    ON CONFLICT DO NOTHING
    RETURNING slot, holder, expires_at
), taken AS (
    SELECT * FROM reused UNION ALL SELECT * FROM added
), held AS (
    SELECT count(*) AS n, min(s.expires_at) AS first_end FROM {{.table}} AS s, clock
    WHERE s.namespace = $1 AND s.key = $2 AND s.slot < $3 AND s.expires_at > clock.now
){{.dequeue}}
SELECT taken.slot, taken.holder::text, (extract(epoch FROM taken.expires_at) * 1000000)::int8,
       held.n, (extract(epoch FROM held.first_end) * 1000000)::int8,
       (extract(epoch FROM clock.now) * 1000000)::int8{{.waiting}}
FROM held CROSS JOIN clock LEFT JOIN taken ON true
{{end}}

-- slots.turn, slots.dequeue and slots.waiting make slots.acquire the
-- statement of a waiter ($6 arrived, $7 waiter: its place in the queue,
-- pglimit_slot_waiters of migration 00010) that takes a slot only in its
-- turn: while fewer live waiters of the key are ahead of it than slots
-- are free, both as the statement's snapshot sees them. Taking one, it
-- leaves the queue; else it renews its place for $8 µs, and answers
-- whether it still had one (false: it lapsed, and the waiter joins
-- again). Placeholder: waiters, the queue table.
{{define "slots.turn"}}, turn AS MATERIALIZED (
    SELECT (SELECT count(*) FROM {{.waiters}} AS w, clock
            WHERE w.namespace = $1 AND w.key = $2 AND w.expires_at > clock.now
              AND (w.arrived, w.waiter) < ($6::bigint, $7::uuid))
         < $3::integer - (SELECT count(*) FROM {{.table}} AS s, clock
                 WHERE s.namespace = $1 AND s.key = $2 AND s.slot < $3 AND s.expires_at > clock.now) AS ok
){{end}}

{{define "slots.dequeue"}}, left_queue AS (
    DELETE FROM {{.waiters}} AS w
    WHERE w.namespace = $1 AND w.key = $2 AND w.arrived = $6 AND w.waiter = $7::uuid AND EXISTS (SELECT FROM taken)
), renewed AS (
    UPDATE {{.waiters}} AS w SET expires_at = clock.now + $8 * interval '1 microsecond'
    FROM clock
    WHERE w.namespace = $1 AND w.key = $2 AND w.arrived = $6 AND w.waiter = $7::uuid AND NOT EXISTS (SELECT FROM taken)
    RETURNING 1
){{end}}

-- slots.enqueue puts a waiter for a slot of key $2 in namespace $1 in the
-- queue, for $3 µs unless renewed, and returns its place.
{{define "slots.enqueue"}}
INSERT INTO {{.waiters}} (namespace, key, arrived, waiter, expires_at)
SELECT $1, $2, (extract(epoch FROM c.now) * 1000000)::int8, gen_random_uuid(), c.now + $3 * interval '1 microsecond'
FROM (SELECT clock_timestamp() AS now) AS c
RETURNING arrived, waiter::text
{{end}}

-- slots.leave takes a waiter that gave up out of the queue.
{{define "slots.leave"}}
DELETE FROM {{.waiters}} WHERE namespace = $1 AND key = $2 AND arrived = $3 AND waiter = $4::uuid
{{end}}

-- slots.extend renews a held slot's lease; slots.release frees it. Both
-- touch the slot only while its holder ($4) still holds it, and return a
-- row only if they did.
{{define "slots.extend"}}
UPDATE {{.table}} SET expires_at = clock_timestamp() + $5 * interval '1 microsecond'
WHERE namespace = $1 AND key = $2 AND slot = $3 AND holder = $4::uuid AND expires_at > clock_timestamp()
RETURNING $5::bigint
{{end}}

-- slots.release_notify is slots.release that, when it frees a slot of a
-- key with live places in the queue, also notifies the namespace's
-- channel (placeholder channel) with the key's tag, the first tag_len hex
-- digits of its SHA-256 (as pglimitsem's tagOf computes it), delivered
-- when the release commits; it answers whether it notified. A release
-- with no waiter notifies nothing, and so takes no part in the lock that
-- serialises the commits of notifying transactions; it pays for the look
-- at the queue only.
{{define "slots.release"}}
DELETE FROM {{.table}}
WHERE namespace = $1 AND key = $2 AND slot = $3 AND holder = $4::uuid AND expires_at > clock_timestamp()
RETURNING false
{{end}}

{{define "slots.release_notify"}}
DELETE FROM {{.table}}
WHERE namespace = $1 AND key = $2 AND slot = $3 AND holder = $4::uuid AND expires_at > clock_timestamp()
RETURNING CASE WHEN EXISTS (SELECT FROM {{.waiters}} AS w
                            WHERE w.namespace = $1 AND w.key = $2 AND w.expires_at > clock_timestamp())
               THEN pg_notify('{{.channel}}', left(encode(sha256(convert_to($2, 'UTF8')), 'hex'), {{.tag_len}}))::text IS NOT NULL
               ELSE false END
{{end}}
