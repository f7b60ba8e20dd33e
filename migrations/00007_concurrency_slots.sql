-- Concurrency limits (pglimit.Semaphore): at most N requests of a key in
-- flight. A key's slots are rows numbered 0 to N-1, each held by one
-- acquisition (holder) until it is released (the row is deleted) or its
-- lease ends (expires_at), whichever comes first. A slot whose holder died
-- returns when its lease ends; the cleanup job deletes it after Retention.

-- +goose Up
CREATE TABLE pglimit_slots (
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    slot       integer     NOT NULL,
    holder     uuid        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (namespace, key, slot)
);

CREATE INDEX pglimit_slots_expires_at_idx ON pglimit_slots (expires_at);

-- +goose Down
DROP TABLE pglimit_slots;
