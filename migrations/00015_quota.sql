-- Billing periods (pglimitquota): a quota of units per key and period,
-- each key's period anchored at its own date.
--
-- pglimit_quota_keys holds one row per key of a namespace: everything a
-- decision reads and writes, so that a decision locks this one row and
-- decides on its latest version. The plan (anchor, zone, allowance, hard
-- cap; NULL zone, allowance and hard cap stand for the quota's Config),
-- a plan that takes over at next_from (SetPlan at the next period), the
-- counters of the period in force (period_start to period_end, written by
-- the decision that started it), and the key's live
-- credits, as two arrays sorted by expiry. A row lives until deleted
-- (pglimitquota.Quota.Forget, with the key's ids; migration 00017
-- indexes the ids by key for it). It has no CHECK constraints: pglimitquota
-- checks every value before it writes (anchors, allowances, caps), and a
-- CHECK makes every UPDATE prepare its expression again, about 40 µs of
-- a decision's 170 µs on the server (docs/limits.md, "Billing periods",
-- Cost).
--
-- pglimit_quota_ids holds one row per admitted decision id, written by
-- the decision's own statement: a retry of the id replays the answer. The
-- row is the admission's ticket for RefundID and SettleID: credit_units
-- and credit_expires are the units it took from each credit, in the order
-- it took them, and done marks it refunded or settled, once, by the
-- statement that gives back or charges. The Cleaner deletes rows past
-- expires_at when its Tables lists the table.
--
-- pglimit_quota_events is the outbox of thresholds crossed: one row per
-- key, period and threshold (basis points of the allowance), written by
-- the decision that crossed it, ON CONFLICT DO NOTHING; a consumer
-- deletes the rows it handled (pglimitquota.Quota.TakeEvents).

-- +goose Up
CREATE TABLE pglimit_quota_keys (
    namespace      text          NOT NULL,
    key            text          NOT NULL,
    anchor_month   smallint      NOT NULL,
    anchor_day     smallint      NOT NULL,
    time_zone      text,
    allowance      bigint,
    hard_cap       bigint,
    anchor_since   timestamptz   NOT NULL, -- no period of this anchor starts before it
    next_month     smallint,
    next_day       smallint,
    next_zone      text,
    next_allowance bigint,
    next_hard_cap  bigint,
    next_from      timestamptz,  -- when the next plan takes over; NULL: none
    period_start   timestamptz,  -- the period the counters count; NULL: none yet
    period_end     timestamptz,  -- that period's end, so that a decision within it does no calendar arithmetic; NULL with it
    from_allowance bigint        NOT NULL DEFAULT 0,
    from_credits   bigint        NOT NULL DEFAULT 0,
    overage        bigint        NOT NULL DEFAULT 0,
    credit_units   bigint[]      NOT NULL DEFAULT '{}',
    credit_expires timestamptz[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (namespace, key)
);

CREATE TABLE pglimit_quota_ids (
    namespace      text          NOT NULL,
    id             text          NOT NULL,
    key            text          NOT NULL,
    answer         bigint[]      NOT NULL, -- cost, the split, the period's counters, allowance, hard cap, credits left
    period_start   timestamptz   NOT NULL,
    period_end     timestamptz   NOT NULL,
    decided_at     timestamptz   NOT NULL,
    expires_at     timestamptz   NOT NULL,
    credit_units   bigint[]      NOT NULL DEFAULT '{}', -- units taken from each credit, in take order
    credit_expires timestamptz[] NOT NULL DEFAULT '{}', -- those credits' expiries
    done           text,         -- 'refunded' or 'settled' once RefundID or SettleID applied; NULL before
    PRIMARY KEY (namespace, id)
);

CREATE INDEX pglimit_quota_ids_expires_at_idx ON pglimit_quota_ids (expires_at);

CREATE TABLE pglimit_quota_events (
    namespace    text        NOT NULL,
    key          text        NOT NULL,
    period_start timestamptz NOT NULL,
    threshold    integer     NOT NULL, -- basis points of the allowance
    period_end   timestamptz NOT NULL,
    used         bigint      NOT NULL, -- units charged to the plan after the crossing
    allowance    bigint      NOT NULL,
    crossed_at   timestamptz NOT NULL,
    PRIMARY KEY (namespace, key, period_start, threshold)
);

CREATE INDEX pglimit_quota_events_crossed_idx ON pglimit_quota_events (namespace, crossed_at);

-- +goose Down
DROP TABLE pglimit_quota_events;
DROP TABLE pglimit_quota_ids;
DROP TABLE pglimit_quota_keys;
