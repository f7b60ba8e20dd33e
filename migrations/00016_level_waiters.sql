-- Priority levels for a Semaphore's waiters (pglimitsem.Semaphore.WaitLevel):
-- a waiter's place records its level, so that the waiters' statement can
-- serve each level's waiters in arrival order, apart from the other
-- levels'. A semaphore that uses no levels leaves the column at its
-- default, and its statements do not name it.

-- +goose Up
ALTER TABLE pglimit_slot_waiters ADD COLUMN level text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE pglimit_slot_waiters DROP COLUMN level;
