-- Weighted fair share for a Semaphore's waiters (pglimitsem.Semaphore.WaitFlow):
-- a waiter names its flow (a tenant) and the flow's weight, and a slot
-- records the flow of the waiter that took it, so that the waiters'
-- statement can count what each flow holds. Priority levels
-- (pglimitsem.Semaphore.AcquireLevel): a slot records the level that took
-- it, so that an acquisition can count what each level holds. A semaphore
-- that uses neither leaves the columns at their defaults, and its
-- statements do not name them.

-- +goose Up
ALTER TABLE pglimit_slots ADD COLUMN flow text NOT NULL DEFAULT '';
ALTER TABLE pglimit_slots ADD COLUMN level text NOT NULL DEFAULT '';
ALTER TABLE pglimit_slot_waiters ADD COLUMN flow text NOT NULL DEFAULT '';
ALTER TABLE pglimit_slot_waiters ADD COLUMN weight integer NOT NULL DEFAULT 1;

-- +goose Down
ALTER TABLE pglimit_slot_waiters DROP COLUMN weight;
ALTER TABLE pglimit_slot_waiters DROP COLUMN flow;
ALTER TABLE pglimit_slots DROP COLUMN level;
ALTER TABLE pglimit_slots DROP COLUMN flow;
