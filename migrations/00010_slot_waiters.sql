-- The queue of a Semaphore's waiters (pglimitsem.Semaphore.Wait): callers
-- that wait for a slot of a key, served in the order they arrived, from
-- every instance. (arrived, waiter) is that order: arrived is the
-- database's clock in µs when the waiter joined, waiter a random id that
-- breaks ties. A waiter may take a slot only while fewer waiters of its
-- key ahead of it are waiting than slots are free. (No sequence: a role
-- with table privileges alone can wait.) A waiter renews expires_at while it waits and deletes
-- its row when it takes a slot or gives up; the row of one that died
-- stops counting when expires_at passes, and the cleanup job, which
-- cleans this table with pglimit_slots, deletes it after Retention.

-- +goose Up
CREATE TABLE pglimit_slot_waiters (
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    arrived    bigint      NOT NULL,
    waiter     uuid        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (namespace, key, arrived, waiter)
);

CREATE INDEX pglimit_slot_waiters_expires_at_idx ON pglimit_slot_waiters (expires_at);

-- +goose Down
DROP TABLE pglimit_slot_waiters;
