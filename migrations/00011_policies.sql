-- Each limiter's policy, as the application configures it: a limiter
-- records its own here at its first decision (pglimit.RecordedPolicies
-- reads it), so that the operator command (cmd/pglimit) and the person on
-- call need not copy the Config out of the code, and a description of a
-- limiter that is not the one the application runs is refused.
--
-- One row per table and namespace: policy is the latest recorded, previous
-- the one recorded before it when that differed. In a rolling deploy that
-- changes a namespace's limits both versions run, and each records its own
-- as it starts: the row then holds both, whichever started last as policy.
-- policy and previous are jsonb:
--   {"strategy": "upsert", "overrides": true,
--    "limits": [{"name": "per-minute", "rate": 5, "period_us": 60000000,
--                "burst": 3, "algorithm": "gcra"}, ...]}
-- with the limits in the limiter's order, defaults filled in.
--
-- A small table: one row per namespace, written once per limiter. On Citus
-- it stays a local table of the coordinator, where the limiter's pool
-- connects.

-- +goose Up
CREATE TABLE pglimit_policies (
    table_name           text        NOT NULL,
    namespace            text        NOT NULL,
    policy               jsonb       NOT NULL,
    recorded_at          timestamptz NOT NULL DEFAULT now(),
    previous             jsonb,
    previous_recorded_at timestamptz,
    PRIMARY KEY (table_name, namespace)
);

-- +goose Down
DROP TABLE pglimit_policies;
