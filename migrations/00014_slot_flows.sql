-- Weighted fair share for a Semaphore's waiters (pglimitsem.Semaphore.WaitFlow):
-- a waiter names its flow (a tenant) and the flow's weight, and a slot
-- records the flow of the waiter that took it, so that the waiters'
-- statement can count what each flow holds. pglimit_slot_flows holds
-- the weights set at runtime (pglimitsem.Semaphore.SetFlowWeight), one
-- per namespace and flow, which win over the weight a waiter names; a
-- row lives until ResetFlowWeight deletes it. Priority levels
-- (pglimitsem.Semaphore.AcquireLevel): a slot records the level that took
-- it, so that an acquisition can count what each level holds. A semaphore
-- that uses neither leaves the columns at their defaults, and its
-- statements do not name them.

-- +goose Up
ALTER TABLE pglimit_slots ADD COLUMN flow text NOT NULL DEFAULT '';
ALTER TABLE pglimit_slots ADD COLUMN level text NOT NULL DEFAULT '';
ALTER TABLE pglimit_slot_waiters ADD COLUMN flow text NOT NULL DEFAULT '';
ALTER TABLE pglimit_slot_waiters ADD COLUMN weight integer NOT NULL DEFAULT 1;
CREATE TABLE pglimit_slot_flows (
    namespace text    NOT NULL,
    flow      text    NOT NULL,
    weight    integer NOT NULL CHECK (weight BETWEEN 1 AND 10000),
    PRIMARY KEY (namespace, flow)
);

-- +goose Down
DROP TABLE pglimit_slot_flows;
ALTER TABLE pglimit_slot_waiters DROP COLUMN weight;
ALTER TABLE pglimit_slot_waiters DROP COLUMN flow;
ALTER TABLE pglimit_slots DROP COLUMN level;
ALTER TABLE pglimit_slots DROP COLUMN flow;
