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
    SET holder = gen_random_uuid(){{.set_extra}}, expires_at = clock.now + $4 * interval '1 microsecond'
    FROM free, clock
    WHERE s.namespace = $1 AND s.key = $2 AND s.slot = free.slot
    RETURNING s.slot, s.holder, s.expires_at
), added AS (
    INSERT INTO {{.table}} (namespace, key, slot, holder, expires_at{{.extra_col}})
    SELECT $1, $2, g, gen_random_uuid(), clock.now + $4 * interval '1 microsecond'{{.extra_val}}
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

-- slots.fair_turn is slots.turn for a waiter of a flow (migration 00014;
-- $9 its flow, which the slot it takes records): the waiters of the key
-- are served in the order of their tags, and within a tag in arrival
-- order. A waiter's tag is (what its flow holds + its place among its
-- flow's live waiters, from 1) / its weight (its flow's in the table
-- flows, placeholder, when set there; else the one it joined with), so that the flow furthest
-- below its weighted share goes first; a flow with no waiter takes no
-- part (its share is lent). A waiter takes a slot while fewer waiters with
-- a lower tag are live than slots are free; one whose place lapsed takes
-- none, and joins again.
{{define "slots.fair_turn"}}, live AS MATERIALIZED (
    SELECT w.flow, w.arrived, w.waiter, coalesce(f.weight, w.weight) AS weight,
           row_number() OVER (PARTITION BY w.flow ORDER BY w.arrived, w.waiter) AS j
    FROM {{.waiters}} AS w CROSS JOIN clock
    LEFT JOIN {{.flows}} AS f ON f.namespace = $1 AND f.flow = w.flow
    WHERE w.namespace = $1 AND w.key = $2 AND w.expires_at > clock.now
), holding AS MATERIALIZED (
    SELECT s.flow, count(*) AS n FROM {{.table}} AS s, clock
    WHERE s.namespace = $1 AND s.key = $2 AND s.slot < $3 AND s.expires_at > clock.now
    GROUP BY s.flow
), tagged AS MATERIALIZED (
    SELECT l.arrived, l.waiter, (coalesce(h.n, 0) + l.j)::float8 / l.weight AS tag
    FROM live AS l LEFT JOIN holding AS h ON h.flow = l.flow
), turn AS MATERIALIZED (
    SELECT CASE WHEN me.waiter IS NULL THEN false
                ELSE (SELECT count(*) FROM tagged AS t
                      WHERE (t.tag, t.arrived, t.waiter) < (me.tag, me.arrived, me.waiter))
                     < $3::integer - (SELECT coalesce(sum(n), 0) FROM holding)
           END AS ok
    FROM (SELECT) AS one LEFT JOIN tagged AS me ON me.arrived = $6 AND me.waiter = $7::uuid
){{end}}

-- slots.no_waiters makes slots.acquire the first try of a waiter of flow
-- $6 (which the slot it takes records), before it joins the queue: it
-- takes a free slot only while the key has no live place in the queue,
-- as the statement's snapshot sees it, and answers whether that was so.
{{define "slots.no_waiters"}}, turn AS MATERIALIZED (
    SELECT NOT EXISTS (SELECT FROM {{.waiters}} AS w, clock
                       WHERE w.namespace = $1 AND w.key = $2 AND w.expires_at > clock.now) AS ok
){{end}}

-- slots.fair_join and slots.join_flow make slots.acquire the join of a
-- waiter of flow $6 (which the slot it takes records) and its first try
-- in turn, in one statement: slots.fair_turn for waiter $7 (its caller's
-- id) as though it had joined now, with weight $9 (its flow's in the
-- table flows when set there), while its flow has fewer than $10 other
-- live places. Taking no slot, it joins the queue, for $8 µs unless
-- renewed, as slots.enqueue_flow does, and answers whether it joined and
-- when it arrived; a waiter in turn that lost a race for a free slot
-- joins nothing, and tries again, and one whose flow's queue is full
-- neither takes a slot nor joins. Waiters joining at the same instant do
-- not see each other's places here: free slots may go to any of them
-- (never more than $3 held), and their next tries count each other.
{{define "slots.fair_join"}}, mine AS MATERIALIZED (
    SELECT (extract(epoch FROM clock.now) * 1000000)::int8 AS arrived FROM clock
), live AS MATERIALIZED (
    SELECT l.flow, l.arrived, l.waiter, l.weight,
           row_number() OVER (PARTITION BY l.flow ORDER BY l.arrived, l.waiter) AS j
    FROM (SELECT w.flow, w.arrived, w.waiter, coalesce(f.weight, w.weight) AS weight
          FROM {{.waiters}} AS w CROSS JOIN clock
          LEFT JOIN {{.flows}} AS f ON f.namespace = $1 AND f.flow = w.flow
          WHERE w.namespace = $1 AND w.key = $2 AND w.expires_at > clock.now
          UNION ALL
          SELECT $6, mine.arrived, $7::uuid,
                 coalesce((SELECT f.weight FROM {{.flows}} AS f WHERE f.namespace = $1 AND f.flow = $6), $9::integer)
          FROM mine) AS l
), holding AS MATERIALIZED (
    SELECT s.flow, count(*) AS n FROM {{.table}} AS s, clock
    WHERE s.namespace = $1 AND s.key = $2 AND s.slot < $3 AND s.expires_at > clock.now
    GROUP BY s.flow
), tagged AS MATERIALIZED (
    SELECT l.arrived, l.waiter, (coalesce(h.n, 0) + l.j)::float8 / l.weight AS tag
    FROM live AS l LEFT JOIN holding AS h ON h.flow = l.flow
), turn AS MATERIALIZED (
    SELECT room AND (SELECT count(*) FROM tagged AS t
                     WHERE (t.tag, t.arrived, t.waiter) < (me.tag, me.arrived, me.waiter))
                    < $3::integer - (SELECT coalesce(sum(n), 0) FROM holding) AS ok,
           room
    FROM tagged AS me,
         (SELECT count(*) <= $10::integer AS room FROM live WHERE live.flow = $6) AS r
    WHERE me.waiter = $7::uuid
){{end}}

{{define "slots.join_flow"}}, joined AS (
    INSERT INTO {{.waiters}} (namespace, key, arrived, waiter, expires_at, flow, weight)
    SELECT $1, $2, mine.arrived, $7::uuid, clock.now + $8 * interval '1 microsecond', $6, $9
    FROM mine, clock
    WHERE NOT EXISTS (SELECT FROM taken) AND (SELECT room FROM turn)
      AND (NOT (SELECT ok FROM turn) OR (SELECT n FROM held) >= $3)
    RETURNING arrived
){{end}}

-- slots.level makes slots.acquire the acquisition of level $6 (which the
-- slot it takes records), of the levels $7 each keeping $8 slots for
-- itself while it holds fewer (its guarantee less what it lends): it
-- takes a free slot only while the level holds fewer than $9 (its
-- ceiling) and a free slot is left beyond what the other levels keep, as
-- the statement's snapshot sees them, and answers whether that was so.
{{define "slots.level"}}{{template "slots.by_level" .}}, turn AS MATERIALIZED (
    SELECT {{template "slots.level_room" .}} AS ok
){{end}}

-- slots.by_level counts the slots of key $2 each level holds, and
-- slots.level_room is whether level $6 may take one more, as slots.level
-- says.
{{define "slots.by_level"}}, by_level AS MATERIALIZED (
    SELECT s.level, count(*) AS n FROM {{.table}} AS s, clock
    WHERE s.namespace = $1 AND s.key = $2 AND s.slot < $3 AND s.expires_at > clock.now
    GROUP BY s.level
){{end}}

{{define "slots.level_room"}}coalesce((SELECT n FROM by_level WHERE level = $6), 0) < $9::integer
       AND $3::integer - (SELECT coalesce(sum(n), 0) FROM by_level)
           - (SELECT coalesce(sum(greatest(k.keep - coalesce(b.n, 0), 0)), 0)
              FROM unnest($7::text[], $8::integer[]) AS k(level, keep)
              LEFT JOIN by_level AS b ON b.level = k.level
              WHERE k.level <> $6) > 0{{end}}

-- slots.level_first makes slots.acquire the first try of a waiter of
-- level $6, before it joins the queue: slots.level, while the level has
-- no live place in the key's queue, as the statement's snapshot sees it,
-- so that the waiter goes ahead of none of its own level's.
{{define "slots.level_first"}}{{template "slots.by_level" .}}, turn AS MATERIALIZED (
    SELECT NOT EXISTS (SELECT FROM {{.waiters}} AS w, clock
                       WHERE w.namespace = $1 AND w.key = $2 AND w.level = $6 AND w.expires_at > clock.now)
       AND {{template "slots.level_room" .}} AS ok
){{end}}

-- slots.level_turn makes slots.acquire the statement of a waiter of level
-- $9 (migration 00016; which the slot it takes records), with its place
-- ($6 arrived, $7 waiter) and its renewal ($8 µs) as slots.turn's, of the
-- levels $10 each keeping $11 slots for itself while it holds fewer, and
-- its ceiling $12. Its level may take as many free slots as slots.level
-- lets it: fewer than $12 held, and free ones beyond what the other
-- levels keep. The waiter takes one while fewer live waiters of its own
-- level are ahead of it than that, so that the waiters of a level are
-- served in arrival order, and never behind another level's.
{{define "slots.level_turn"}}{{template "slots.by_level" .}}, turn AS MATERIALIZED (
    SELECT (SELECT count(*) FROM {{.waiters}} AS w, clock
            WHERE w.namespace = $1 AND w.key = $2 AND w.level = $9 AND w.expires_at > clock.now
              AND (w.arrived, w.waiter) < ($6::bigint, $7::uuid))
         < least($12::integer - coalesce((SELECT n FROM by_level WHERE level = $9), 0),
                 $3::integer - (SELECT coalesce(sum(n), 0) FROM by_level)
                 - (SELECT coalesce(sum(greatest(k.keep - coalesce(b.n, 0), 0)), 0)
                    FROM unnest($10::text[], $11::integer[]) AS k(level, keep)
                    LEFT JOIN by_level AS b ON b.level = k.level
                    WHERE k.level <> $9)) AS ok
){{end}}

-- slots.enqueue_level is slots.enqueue for a waiter $5 of level $4.
{{define "slots.enqueue_level"}}
INSERT INTO {{.waiters}} (namespace, key, arrived, waiter, expires_at, level)
SELECT $1, $2, (extract(epoch FROM c.now) * 1000000)::int8, $5::uuid, c.now + $3 * interval '1 microsecond', $4
FROM (SELECT clock_timestamp() AS now) AS c
RETURNING arrived
{{end}}

-- slots.set_flow_weight sets the weight of flow $2 in namespace $1 to
-- $3; slots.reset_flow_weight deletes it, so that waiters' own weights
-- count again.
{{define "slots.set_flow_weight"}}
INSERT INTO {{.flows}} (namespace, flow, weight) VALUES ($1, $2, $3)
ON CONFLICT (namespace, flow) DO UPDATE SET weight = excluded.weight
{{end}}

{{define "slots.reset_flow_weight"}}
DELETE FROM {{.flows}} WHERE namespace = $1 AND flow = $2
{{end}}

-- slots.enqueue_flow is slots.enqueue for a waiter $7 of flow $4 with
-- weight $5, which joins only while its flow has fewer than $6 live places
-- in the key's queue (as the statement's snapshot sees them): it returns
-- no row when the flow's queue is full.
{{define "slots.enqueue_flow"}}
INSERT INTO {{.waiters}} (namespace, key, arrived, waiter, expires_at, flow, weight)
SELECT $1, $2, (extract(epoch FROM c.now) * 1000000)::int8, $7::uuid, c.now + $3 * interval '1 microsecond', $4, $5
FROM (SELECT clock_timestamp() AS now) AS c
WHERE (SELECT count(*) FROM {{.waiters}} AS w
       WHERE w.namespace = $1 AND w.key = $2 AND w.flow = $4 AND w.expires_at > c.now) < $6
RETURNING arrived
{{end}}

-- slots.enqueue puts waiter $4 (an id its caller made) for a slot of key
-- $2 in namespace $1 in the queue, for $3 µs unless renewed, and returns
-- when it arrived, its place with $4.
{{define "slots.enqueue"}}
INSERT INTO {{.waiters}} (namespace, key, arrived, waiter, expires_at)
SELECT $1, $2, (extract(epoch FROM c.now) * 1000000)::int8, $4::uuid, c.now + $3 * interval '1 microsecond'
FROM (SELECT clock_timestamp() AS now) AS c
RETURNING arrived
{{end}}

-- slots.leave takes a waiter that gave up out of the queue.
{{define "slots.leave"}}
DELETE FROM {{.waiters}} WHERE namespace = $1 AND key = $2 AND arrived = $3 AND waiter = $4::uuid
{{end}}

-- slots.leave_joined takes waiter $3 out of key $2's queue when its join
-- failed unseen (it may have committed): by its id alone, among the key's
-- places.
{{define "slots.leave_joined"}}
DELETE FROM {{.waiters}} WHERE namespace = $1 AND key = $2 AND waiter = $3::uuid
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
