-- The statements of pglimitquota: billing periods anchored per key
-- (migration 00015). Placeholders: keys, ids and events, the three tables.
--
-- quota.period is the head every statement shares: the clock, read once;
-- the key's row (locked FOR UPDATE when lock says so, so that a decision
-- decides on its latest version, every other decision of the key waiting);
-- a key with no row stands for a new key anchored at this instant, in the
-- default zone, on the quota's default plan (new is true; a monthly
-- anchor's month is always 1, so that anchors compare by their day); the plan in
-- force, the next plan once its time has come (due); and the period that
-- holds the instant. Parameters: $1 namespace, $2 key, $3 the period in
-- months (1 or 12), $4 the default zone, $5 the default allowance, $6 the
-- default hard cap.
--
-- The period: months are counted from year 0 (k = 12 * year + month - 1);
-- a period starts at local midnight, in the plan's zone, of the anchor's
-- day clamped to its month's last day (make_timestamptz converts the
-- local time to an instant, DST included), in a month k with
-- k = anchor month - 1 modulo the period (every month for a monthly
-- plan). start is that instant of the latest such month not after now,
-- and never before the anchor took effect (since); end, the next one.
-- A key whose row holds a period that holds now (period_start <= now <
-- period_end, written by the decision that started it) keeps it (kept),
-- unless a next plan is due, without that arithmetic, which a decision
-- would otherwise do every time: about a third of its cost. So a period,
-- once started, ends when it said it would, whatever a Config's default
-- zone or period says later; SetPlan with a new anchor clears it.
-- Each step is a subquery of the next, fenced with OFFSET 0, so that the
-- planner neither pulls it up and copies its expression into every use
-- nor searches join orders among the steps: unfenced LATERAL steps nest
-- into an expression that costs milliseconds to plan and to evaluate.
{{define "quota.period"}}
WITH clock AS (
    SELECT clock_timestamp() AS now
), locked AS (
    SELECT t.* FROM {{.keys}} AS t
    WHERE t.namespace = $1 AND t.key = $2
    {{.lock}}
), found AS (
    SELECT false AS new, l.anchor_month, l.anchor_day, l.time_zone, l.allowance, l.hard_cap, l.anchor_since,
           l.next_month, l.next_day, l.next_zone, l.next_allowance, l.next_hard_cap, l.next_from,
           l.period_start, l.period_end, l.from_allowance, l.from_credits, l.overage, l.credit_units, l.credit_expires
    FROM locked AS l
    UNION ALL
    SELECT true, CASE WHEN $3::integer = 12 THEN extract(month FROM c.now AT TIME ZONE $4::text)::smallint ELSE 1::smallint END,
           extract(day FROM c.now AT TIME ZONE $4::text)::smallint,
           NULL::text, NULL::bigint, NULL::bigint, c.now,
           NULL::smallint, NULL::smallint, NULL::text, NULL::bigint, NULL::bigint, NULL::timestamptz,
           NULL::timestamptz, NULL::timestamptz, 0::bigint, 0::bigint, 0::bigint, '{}'::bigint[], '{}'::timestamptz[]
    FROM clock AS c WHERE NOT EXISTS (SELECT FROM locked)
), plan AS (
    SELECT f.*, d.due,
           CASE WHEN d.due THEN f.next_month ELSE f.anchor_month END AS p_month,
           CASE WHEN d.due THEN f.next_day ELSE f.anchor_day END AS p_day,
           CASE WHEN d.due THEN f.next_zone ELSE f.time_zone END AS p_zone,
           CASE WHEN d.due THEN f.next_allowance ELSE f.allowance END AS p_allowance,
           CASE WHEN d.due THEN f.next_hard_cap ELSE f.hard_cap END AS p_hard_cap,
           CASE WHEN d.due THEN f.next_from ELSE f.anchor_since END AS p_since
    FROM found AS f, clock AS c, LATERAL (SELECT coalesce(f.next_from <= c.now, false) AS due) AS d
), period AS (
    SELECT p.*, b.zone, coalesce(p.p_allowance, $5::bigint) AS allow, coalesce(p.p_hard_cap, $6::bigint) AS cap,
           b.start_at, b.end_at
    FROM plan AS p, clock AS c, LATERAL (SELECT coalesce(NOT p.due AND p.period_start <= c.now AND c.now < p.period_end, false) AS kept) AS f, LATERAL (
        SELECT coalesce(p.p_zone, $4::text) AS zone, p.period_start AS start_at, p.period_end AS end_at WHERE f.kept
        UNION ALL
        SELECT x.zone, greatest({{template "quota.bound" "x.k"}}, p.p_since), {{template "quota.bound" "x.k + $3::integer"}}
        FROM (SELECT x.zone, CASE WHEN {{template "quota.bound" "x.k"}} <= x.now THEN x.k ELSE x.k - $3::integer END AS k
              FROM (SELECT x.zone, x.now, x.mi - (((x.mi - (p.p_month - 1)) % $3::integer) + $3::integer) % $3::integer AS k
                    FROM (SELECT z.zone, c.now, (extract(year FROM c.now AT TIME ZONE z.zone) * 12 + extract(month FROM c.now AT TIME ZONE z.zone) - 1)::integer AS mi
                          FROM clock AS c, (SELECT coalesce(p.p_zone, $4::text) AS zone) AS z
                          OFFSET 0) AS x
                    OFFSET 0) AS x
              OFFSET 0) AS x
        WHERE NOT f.kept
    ) AS b
), state AS (
    SELECT pe.*, s.same,
           CASE WHEN s.same THEN pe.from_allowance ELSE 0 END AS ua,
           CASE WHEN s.same THEN pe.from_credits ELSE 0 END AS uc,
           CASE WHEN s.same THEN pe.overage ELSE 0 END AS uo
    FROM period AS pe, LATERAL (SELECT coalesce(pe.period_start = pe.start_at, false) AS same) AS s
), credits AS (
    SELECT x.u, x.e, x.o, sum(x.u) OVER (ORDER BY x.e, x.o) AS cum
    FROM state AS s, clock AS c, unnest(s.credit_units, s.credit_expires) WITH ORDINALITY AS x(u, e, o)
    WHERE x.e > c.now AND x.u > 0
), avail AS (
    SELECT coalesce(sum(x.u), 0)::bigint AS units, count(*) AS n FROM credits AS x
)
{{- end}}

-- quota.bound is the instant a period starts in month k (the expression
-- given): local midnight, in the zone, of the anchor's day clamped to the
-- month's last day.
{{define "quota.bound"}}make_timestamptz(({{.}}) / 12, ({{.}}) % 12 + 1, least(p.p_day::integer, extract(day FROM make_date(({{.}}) / 12, ({{.}}) % 12 + 1, 1) + interval '1 month - 1 day')::integer), 0, 0, 0, x.zone){{end}}

-- quota.allow charges $7 units to key $2: the allowance first, then the
-- unexpired credits, earliest expiry first (a credit counts while now <
-- its expiry), then overage while the units charged to the plan
-- (allowance and overage) stay within the hard cap; past it, it charges
-- nothing. With id set (a decision with an id), $8 is the id, $9 its
-- retention in µs and $10 the thresholds in basis points; without, $8 is
-- the thresholds (th names which), and the statement neither reads nor
-- writes the ids table: a decision without an id does not open it and its
-- three indexes, about 20 µs of a decision's time. The id's row keeps the
-- units the admission took from each credit, in the order it took them
-- (credit_units, credit_expires), for a refund by id (quota.refund).
--
-- With settle set (SettleID of an admission whose cost was below the real
-- one), $7 is the excess, $8 the id, $9 its admission's decided_at and
-- $10 the thresholds: marked marks the id's row settled, and only a row of
-- key $2, of that admission, not yet refunded nor settled; the excess is
-- charged as a decision's units, except that the overage stops at the
-- hard cap instead of refusing (the rest is forgiven), and only if marked
-- did mark the row (allowed). The key's row is locked before the id's
-- (marked reads state), as in every statement that writes both.
--
-- Why it is safe: the key's row is locked before anything is read from
-- it, and everything a decision needs is in that row, so concurrent
-- decisions of a key run one after the other, each on the version the
-- last committed. A new key's row is inserted without ON CONFLICT: a
-- concurrent first decision that committed after this statement's
-- snapshot makes it fail with unique_violation, which undoes the whole
-- statement, and the caller runs it again. An id is written only by an
-- admission, in the same statement as its charge, without ON CONFLICT:
-- an id taken by a decision that committed after the snapshot fails the
-- statement the same way, and the caller replays that decision (taken
-- answers it at once when the snapshot sees the id). A threshold's event
-- is inserted ON CONFLICT DO NOTHING, so that the key, period and
-- threshold have one row whatever crosses it again. A refusal writes
-- nothing.
{{define "quota.allow"}}
{{template "quota.period" .}}{{if .settle}}, marked AS (
    UPDATE {{.ids}} AS i SET done = 'settled'
    FROM state AS s
    WHERE i.namespace = $1 AND i.id = $8::text AND i.key = $2 AND i.decided_at = $9::timestamptz AND i.done IS NULL
    RETURNING 1
){{end}}, decided AS (
    SELECT s.*, a.units AS avail_units, a.n AS avail_n, {{if .id}}t.taken{{else}}false AS taken{{end}}, ta.v AS take_a, tc.v AS take_c, o.v AS take_o,
           {{if .settle}}EXISTS (SELECT FROM marked){{else}}{{if .id}}NOT t.taken AND {{end}}(o.v = 0 OR s.ua + ta.v + s.uo + o.v <= s.cap){{end}} AS allowed
    FROM state AS s, avail AS a,
         {{- if .id}}
         LATERAL (SELECT $8::text IS NOT NULL AND EXISTS (SELECT FROM {{.ids}} AS i WHERE i.namespace = $1 AND i.id = $8::text) AS taken OFFSET 0) AS t,
         {{- end}}
         LATERAL (SELECT least($7::bigint, greatest(s.allow - s.ua, 0)) AS v OFFSET 0) AS ta,
         LATERAL (SELECT least($7::bigint - ta.v, a.units) AS v OFFSET 0) AS tc,
         LATERAL (SELECT {{if .settle}}least($7::bigint - ta.v - tc.v, greatest(s.cap - s.ua - ta.v - s.uo, 0)){{else}}$7::bigint - ta.v - tc.v{{end}} AS v OFFSET 0) AS o
), spent AS (
    SELECT x.e, x.o, x.u - least(x.u, greatest(d.take_c - (x.cum - x.u), 0)) AS u{{if .id}}, least(x.u, greatest(d.take_c - (x.cum - x.u), 0)) AS t{{end}}
    FROM credits AS x, decided AS d
), kept AS (
    SELECT coalesce(array_agg(s.u ORDER BY s.e, s.o), '{}') AS units, coalesce(array_agg(s.e ORDER BY s.e, s.o), '{}') AS expires
    FROM spent AS s WHERE s.u > 0
{{- if .id}}
), took AS (
    SELECT coalesce(array_agg(s.t ORDER BY s.e, s.o), '{}') AS units, coalesce(array_agg(s.e ORDER BY s.e, s.o), '{}') AS expires
    FROM spent AS s WHERE s.t > 0
{{- end}}
), written AS (
    UPDATE {{.keys}} AS t
    SET anchor_month = d.p_month, anchor_day = d.p_day, time_zone = d.p_zone, allowance = d.p_allowance,
        hard_cap = d.p_hard_cap, anchor_since = d.p_since,
        next_month = CASE WHEN d.due THEN NULL ELSE t.next_month END,
        next_day = CASE WHEN d.due THEN NULL ELSE t.next_day END,
        next_zone = CASE WHEN d.due THEN NULL ELSE t.next_zone END,
        next_allowance = CASE WHEN d.due THEN NULL ELSE t.next_allowance END,
        next_hard_cap = CASE WHEN d.due THEN NULL ELSE t.next_hard_cap END,
        next_from = CASE WHEN d.due THEN NULL ELSE t.next_from END,
        period_start = d.start_at, period_end = d.end_at, from_allowance = d.ua + d.take_a, from_credits = d.uc + d.take_c,
        overage = d.uo + d.take_o, credit_units = k.units, credit_expires = k.expires
    FROM decided AS d, kept AS k
    WHERE t.namespace = $1 AND t.key = $2 AND d.allowed AND NOT d.new
    RETURNING 1
), inserted AS (
    INSERT INTO {{.keys}} (namespace, key, anchor_month, anchor_day, anchor_since, period_start, period_end, from_allowance, overage)
    SELECT $1, $2, d.p_month, d.p_day, d.p_since, d.start_at, d.end_at, d.take_a, d.take_o
    FROM decided AS d WHERE d.allowed AND d.new
    RETURNING 1
{{- if .id}}
), claimed AS (
    INSERT INTO {{.ids}} (namespace, id, key, answer, period_start, period_end, decided_at, expires_at, credit_units, credit_expires)
    SELECT $1, $8::text, $2,
           ARRAY[$7::bigint, d.take_a, d.take_c, d.take_o, d.ua + d.take_a, d.uc + d.take_c, d.uo + d.take_o, d.allow, d.cap, d.avail_units - d.take_c],
           d.start_at, d.end_at, c.now, c.now + $9::bigint * interval '1 microsecond', k.units, k.expires
    FROM decided AS d, clock AS c, took AS k WHERE d.allowed AND $8::text IS NOT NULL
    RETURNING 1
{{- end}}
), crossed AS (
    INSERT INTO {{.events}} (namespace, key, period_start, threshold, period_end, used, allowance, crossed_at)
    SELECT $1, $2, d.start_at, th.bp, d.end_at, d.ua + d.uo + d.take_a + d.take_o, d.allow, c.now
    FROM decided AS d, clock AS c, unnest({{.th}}::integer[]) AS th(bp),
         LATERAL (SELECT (d.allow * th.bp + 9999) / 10000 AS mark) AS m
    WHERE d.allowed AND d.allow > 0 AND d.ua + d.uo < m.mark AND m.mark <= d.ua + d.uo + d.take_a + d.take_o
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT d.allowed, d.taken,
       CASE WHEN d.allowed THEN d.take_a ELSE 0 END, CASE WHEN d.allowed THEN d.take_c ELSE 0 END, CASE WHEN d.allowed THEN d.take_o ELSE 0 END,
       d.ua + CASE WHEN d.allowed THEN d.take_a ELSE 0 END, d.uc + CASE WHEN d.allowed THEN d.take_c ELSE 0 END,
       d.uo + CASE WHEN d.allowed THEN d.take_o ELSE 0 END, d.allow, d.cap,
       d.avail_units - CASE WHEN d.allowed THEN d.take_c ELSE 0 END, d.start_at, d.end_at, c.now
FROM decided AS d, clock AS c
{{end}}

-- quota.allow_kept is quota.allow for its common case, in one UPDATE of
-- the key's row and nothing else to set up: a key whose row holds a
-- period that holds now (period_start <= now < period_end), with no next
-- plan due, whose allowance alone takes the units, and which crosses
-- no threshold. It charges them to the allowance and
-- answers as quota.allow does; in any other case it matches no row,
-- writes nothing and answers no row, and the caller sends quota.allow.
-- Parameters: $1 namespace, $2 key, $3 the default allowance, $4 the
-- default hard cap, $5 the units; with id set, $6 the id, $7 its
-- retention in µs and $8 the thresholds; without, $6 the thresholds (th
-- names which). An id the table holds already matches no row (quota.allow
-- then replays it), and the admission's id row is inserted without ON
-- CONFLICT, so that an id taken by a decision that committed since fails
-- the statement. The UPDATE locks the key's row and checks its WHERE
-- again on the row's latest version (EvalPlanQual), so concurrent
-- decisions of the key still run one after the other. Expired credits
-- stay in the row until a statement that rewrites the credits (quota.allow,
-- quota.grant, quota.refund) drops them; every reader skips them.
{{define "quota.allow_kept"}}
WITH clock AS (
    SELECT clock_timestamp() AS now
), written AS (
    UPDATE {{.keys}} AS t
    SET from_allowance = t.from_allowance + $5::bigint
    FROM clock AS c
    WHERE t.namespace = $1 AND t.key = $2
      AND t.period_start <= c.now AND c.now < t.period_end AND NOT coalesce(t.next_from <= c.now, false)
      AND t.from_allowance + $5::bigint <= coalesce(t.allowance, $3::bigint)
      AND NOT EXISTS (SELECT FROM unnest({{.th}}::integer[]) AS th(bp), LATERAL (SELECT (coalesce(t.allowance, $3::bigint) * th.bp + 9999) / 10000 AS mark) AS m
                      WHERE t.from_allowance + t.overage < m.mark AND m.mark <= t.from_allowance + t.overage + $5::bigint)
      {{- if .id}}
      AND NOT EXISTS (SELECT FROM {{.ids}} AS i WHERE i.namespace = $1 AND i.id = $6::text)
      {{- end}}
    RETURNING t.from_allowance AS ua, t.from_credits AS uc, t.overage AS uo, coalesce(t.allowance, $3::bigint) AS allow, coalesce(t.hard_cap, $4::bigint) AS cap,
              (SELECT coalesce(sum(x.u), 0)::bigint FROM unnest(t.credit_units, t.credit_expires) AS x(u, e) WHERE x.e > c.now AND x.u > 0) AS credits,
              t.period_start, t.period_end, c.now
{{- if .id}}
), claimed AS (
    INSERT INTO {{.ids}} (namespace, id, key, answer, period_start, period_end, decided_at, expires_at, credit_units, credit_expires)
    SELECT $1, $6::text, $2, ARRAY[$5::bigint, $5::bigint, 0, 0, w.ua, w.uc, w.uo, w.allow, w.cap, w.credits],
           w.period_start, w.period_end, w.now, w.now + $7::bigint * interval '1 microsecond', '{}', '{}'
    FROM written AS w
    RETURNING 1
{{- end}}
)
SELECT true, false, $5::bigint, 0::bigint, 0::bigint, w.ua, w.uc, w.uo, w.allow, w.cap, w.credits, w.period_start, w.period_end, w.now
FROM written AS w
{{end}}

-- quota.usage is the key's current period, read without a lock and
-- without writing: its counters, plan and live credits. A key with no
-- row answers as a new key would at this instant.
{{define "quota.usage"}}
{{template "quota.period" .}}
SELECT s.ua, s.uc, s.uo, s.allow, s.cap, a.units, s.start_at, s.end_at, c.now
FROM state AS s, avail AS a, clock AS c
{{end}}

-- quota.set_plan sets the key's plan: $7 anchor month, $8 anchor day, $9
-- zone, $10 allowance, $11 hard cap. $12 true sets it for the next period
-- (next_from, the end of the period in force; a key with no row takes it
-- at once); false, at once: a plan whose anchor month, day and zone are
-- the ones in force keeps the period and its counters, any other starts a
-- period now and clears them (period_start NULL), so that nothing counts
-- even when the period in force started at this very instant. Either clears a next plan set before. The zone is checked by
-- the statement itself: an unknown one fails it (22023) and writes nothing.
{{define "quota.set_plan"}}
{{template "quota.period" .}}, checked AS (
    SELECT c.now AT TIME ZONE $9::text AS there FROM clock AS c
), decided AS (
    SELECT s.*, $12::boolean AND NOT s.new AS later,
           (CASE WHEN $3::integer = 12 THEN s.p_month ELSE 1 END, s.p_day, s.zone) IS NOT DISTINCT FROM ($7::smallint, $8::smallint, $9::text) AS same_anchor
    FROM state AS s, checked AS ch
    WHERE ch.there IS NOT NULL -- used, so that the zone is read, and an unknown one fails
), written AS (
    UPDATE {{.keys}} AS t
    SET anchor_month = CASE WHEN d.later THEN d.p_month ELSE $7::smallint END,
        anchor_day = CASE WHEN d.later THEN d.p_day ELSE $8::smallint END,
        time_zone = CASE WHEN d.later THEN d.p_zone ELSE $9::text END,
        allowance = CASE WHEN d.later THEN d.p_allowance ELSE $10::bigint END,
        hard_cap = CASE WHEN d.later THEN d.p_hard_cap ELSE $11::bigint END,
        anchor_since = CASE WHEN d.later OR d.same_anchor THEN d.p_since ELSE c.now END,
        next_month = CASE WHEN d.later THEN $7::smallint END,
        next_day = CASE WHEN d.later THEN $8::smallint END,
        next_zone = CASE WHEN d.later THEN $9::text END,
        next_allowance = CASE WHEN d.later THEN $10::bigint END,
        next_hard_cap = CASE WHEN d.later THEN $11::bigint END,
        next_from = CASE WHEN d.later THEN d.end_at END,
        period_start = CASE WHEN d.later OR d.same_anchor THEN t.period_start END,
        period_end = CASE WHEN d.later OR d.same_anchor THEN t.period_end END,
        from_allowance = CASE WHEN d.later OR d.same_anchor THEN t.from_allowance ELSE 0 END,
        from_credits = CASE WHEN d.later OR d.same_anchor THEN t.from_credits ELSE 0 END,
        overage = CASE WHEN d.later OR d.same_anchor THEN t.overage ELSE 0 END
    FROM decided AS d, clock AS c
    WHERE t.namespace = $1 AND t.key = $2 AND NOT d.new
    RETURNING 1
), inserted AS (
    INSERT INTO {{.keys}} (namespace, key, anchor_month, anchor_day, time_zone, allowance, hard_cap, anchor_since)
    SELECT $1, $2, $7::smallint, $8::smallint, $9::text, $10::bigint, $11::bigint, c.now
    FROM decided AS d, clock AS c WHERE d.new
    RETURNING 1
)
SELECT d.later, CASE WHEN d.later THEN d.end_at ELSE c.now END FROM decided AS d, clock AS c
{{end}}

-- quota.grant adds a credit of $7 units expiring at $8 to key $2, unless
-- $8 is not after now or the key holds $9 live credits already: then it
-- writes nothing and answers false. Expired and spent credits are dropped
-- as it writes.
{{define "quota.grant"}}
{{template "quota.period" .}}, decided AS (
    SELECT s.*, $8::timestamptz > c.now AND a.n < $9::integer AS ok, c.now
    FROM state AS s, avail AS a, clock AS c
), merged AS (
    SELECT coalesce(array_agg(x.u ORDER BY x.e, x.o), '{}') AS units, coalesce(array_agg(x.e ORDER BY x.e, x.o), '{}') AS expires
    FROM (SELECT c.u, c.e, c.o FROM credits AS c UNION ALL SELECT $7::bigint, $8::timestamptz, 9223372036854775807) AS x
), written AS (
    UPDATE {{.keys}} AS t
    SET credit_units = m.units, credit_expires = m.expires
    FROM decided AS d, merged AS m
    WHERE t.namespace = $1 AND t.key = $2 AND d.ok AND NOT d.new
    RETURNING 1
), inserted AS (
    INSERT INTO {{.keys}} (namespace, key, anchor_month, anchor_day, anchor_since, credit_units, credit_expires)
    SELECT $1, $2, d.p_month, d.p_day, d.p_since, m.units, m.expires
    FROM decided AS d, merged AS m WHERE d.ok AND d.new
    RETURNING 1
)
SELECT d.ok, d.now FROM decided AS d
{{end}}

-- quota.lookup_id is the answer of the admission of id $2 in namespace
-- $1, if any, with its ticket: the units it took from each credit and
-- whether it was refunded or settled by id (done).
{{define "quota.lookup_id"}}
SELECT i.key, i.answer, i.period_start, i.period_end, i.decided_at, i.credit_units, i.credit_expires, i.done
FROM {{.ids}} AS i WHERE i.namespace = $1 AND i.id = $2
{{end}}

-- quota.refund gives back units of the admission of id $7 (RefundID, and
-- SettleID of a cost below the admission's), whose lookup read key $2,
-- decided_at $8 and period start $9: $10 units to the allowance and $11
-- off the overage, while that period is still the key's current one
-- (open), and the credit units $12 to the credits of expiries $13 that
-- are still live, wherever the period is: each expiry's units to the
-- first live credit of that expiry (in spending order), else to a credit
-- of their own while the key holds fewer than $15 live credits (earliest
-- expiry first); the rest is not given back. The period's counters drop
-- by what went back while it is open, each at most to 0 (a period that
-- a SetPlan with a new anchor started at the admission's very instant
-- has the admission's start but not its units). marked marks the id's row done
-- ($14: 'refunded' or 'settled'), and only a row of that admission not
-- yet refunded nor settled; nothing else is written unless it did, so two
-- refunds or settles of one id apply once: the second waits on the key's
-- row, then marks nothing (its EvalPlanQual recheck sees done set) and
-- answers false first (marked). The key's row is locked before the id's (marked reads
-- state). No threshold event is written or deleted.
{{define "quota.refund"}}
{{template "quota.period" .}}, marked AS (
    UPDATE {{.ids}} AS i SET done = $14::text
    FROM state AS s
    WHERE i.namespace = $1 AND i.id = $7::text AND i.key = $2 AND i.decided_at = $8::timestamptz AND i.done IS NULL
    RETURNING 1
), decided AS (
    SELECT s.*, EXISTS (SELECT FROM marked) AS ok, s.same AND s.start_at = $9::timestamptz AS cur
    FROM state AS s
), back AS (
    SELECT r.e, sum(r.u)::bigint AS u
    FROM unnest($12::bigint[], $13::timestamptz[]) AS r(u, e), clock AS c
    WHERE r.e > c.now
    GROUP BY r.e
), placed AS (
    SELECT b.e, b.u, t.o,
           t.o IS NOT NULL OR a.n + count(*) FILTER (WHERE t.o IS NULL) OVER (ORDER BY b.e) <= $15::integer AS fits
    FROM back AS b, avail AS a, LATERAL (SELECT min(x.o) AS o FROM credits AS x WHERE x.e = b.e) AS t
), merged AS (
    SELECT coalesce(array_agg(x.u ORDER BY x.e, x.o), '{}') AS units, coalesce(array_agg(x.e ORDER BY x.e, x.o), '{}') AS expires
    FROM (SELECT c.u + coalesce((SELECT p.u FROM placed AS p WHERE p.o = c.o), 0) AS u, c.e, c.o FROM credits AS c
          UNION ALL
          SELECT p.u, p.e, 9223372036854775807 FROM placed AS p WHERE p.o IS NULL AND p.fits) AS x
), given AS (
    SELECT d.ok AND NOT d.new AS ok,
           CASE WHEN d.ok AND d.cur THEN least($10::bigint, d.ua) ELSE 0 END AS ra,
           CASE WHEN d.ok AND NOT d.new THEN (SELECT coalesce(sum(p.u), 0) FROM placed AS p WHERE p.fits) ELSE 0 END::bigint AS rc,
           CASE WHEN d.ok AND d.cur THEN least($11::bigint, d.uo) ELSE 0 END AS ro
    FROM decided AS d
), written AS (
    UPDATE {{.keys}} AS t
    SET from_allowance = CASE WHEN d.cur THEN d.ua - g.ra ELSE d.from_allowance END,
        from_credits = CASE WHEN d.cur THEN greatest(d.uc - g.rc, 0) ELSE d.from_credits END,
        overage = CASE WHEN d.cur THEN d.uo - g.ro ELSE d.overage END,
        credit_units = m.units, credit_expires = m.expires
    FROM decided AS d, given AS g, merged AS m
    WHERE t.namespace = $1 AND t.key = $2 AND g.ok
    RETURNING 1
)
SELECT s.ok, g.ra, g.rc, g.ro,
       s.ua - CASE WHEN s.cur THEN g.ra ELSE 0 END, CASE WHEN s.cur THEN greatest(s.uc - g.rc, 0) ELSE s.uc END, s.uo - CASE WHEN s.cur THEN g.ro ELSE 0 END,
       s.allow, s.cap, a.units + g.rc, s.start_at, s.end_at, c.now
FROM decided AS s, given AS g, avail AS a, clock AS c
{{end}}

-- quota.take_events deletes up to $2 events of namespace $1, the oldest
-- crossings first, skipping those another consumer holds, and returns
-- them: in the consumer's transaction, they are gone once it commits and
-- back if it rolls back.
{{define "quota.take_events"}}
DELETE FROM {{.events}} AS e
WHERE (e.namespace, e.key, e.period_start, e.threshold) IN (
    SELECT o.namespace, o.key, o.period_start, o.threshold FROM {{.events}} AS o
    WHERE o.namespace = $1
    ORDER BY o.crossed_at, o.key, o.threshold
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
RETURNING e.key, e.period_start, e.period_end, e.threshold, e.used, e.allowance, e.crossed_at
{{end}}

-- quota.forget deletes key $2's row (plan, anchor, counters, credits) and
-- every row of its ids, in one statement; the key's threshold events
-- stay, an outbox the application has not read. It locks the key's row
-- as a decision does (FOR UPDATE), so that it waits for a decision of the
-- key in progress and none starts on the row until it commits.
--
-- Why it is safe: every admission with an id writes the id and the
-- key's row in one statement under that lock, so the key's ids that
-- this statement's snapshot sees are all of them, unless the row changed
-- between the snapshot and the lock (a decision that committed while
-- this statement waited for it): then seen, the version the snapshot
-- reads, is not locked, the latest one (their ctids differ), and the
-- statement deletes nothing and answers false (done); the caller runs it
-- again, on a snapshot that sees that decision. A key with no row in the
-- snapshot (never decided, or a first decision not committed when the
-- statement began) has no row to lock: the statement deletes the ids the
-- snapshot sees, none unless a row was deleted by hand, and a decision
-- that commits later counts on a fresh row. A row deleted meanwhile (a
-- concurrent forget) has nothing left to delete. The ids are deleted
-- only once the lock is taken (their DELETE reads decided); both DELETEs
-- run whether or not the last SELECT reads them.
{{define "quota.forget"}}
WITH seen AS (
    SELECT t.ctid AS v FROM {{.keys}} AS t WHERE t.namespace = $1 AND t.key = $2
), locked AS (
    SELECT t.ctid AS v FROM {{.keys}} AS t WHERE t.namespace = $1 AND t.key = $2
    FOR UPDATE
), decided AS (
    SELECT NOT EXISTS (SELECT FROM locked) OR EXISTS (SELECT FROM locked AS l, seen AS s WHERE l.v = s.v) AS done
), gone AS (
    DELETE FROM {{.keys}} AS t USING decided AS d
    WHERE t.namespace = $1 AND t.key = $2 AND d.done
), ids AS (
    DELETE FROM {{.ids}} AS i USING decided AS d
    WHERE i.namespace = $1 AND i.key = $2 AND d.done
)
SELECT d.done FROM decided AS d
{{end}}
