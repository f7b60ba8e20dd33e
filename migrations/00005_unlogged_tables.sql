-- UNLOGGED copies of the Upsert and NoWait tables, for limiters that accept
-- losing their state on a crash, as Redis without persistence does: select
-- one with pglimit.Config.Table = 'pglimit_upsert_unlogged' (or
-- 'pglimit_nowait_unlogged'), and list it in pglimit.CleanerConfig.Tables
-- for the cleanup job.
--
-- An unlogged table writes no WAL, so an admission waits for no WAL flush,
-- durable settings or not. The cost: after a crash or an immediate
-- shutdown (not a clean one) PostgreSQL empties the table, so every key
-- starts afresh and may be admitted at once; a replica has no copy, and a
-- failover to it starts empty. The tables have the shape of the logged
-- ones, expires_at index included, so every strategy, limit and the
-- cleanup job work on them unchanged.

-- +goose Up
CREATE UNLOGGED TABLE pglimit_upsert_unlogged (
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    expires_at timestamptz NOT NULL,
    state      bigint[],
    PRIMARY KEY (namespace, key)
);
CREATE INDEX pglimit_upsert_unlogged_expires_at_idx ON pglimit_upsert_unlogged (expires_at);

CREATE UNLOGGED TABLE pglimit_nowait_unlogged (
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    expires_at timestamptz NOT NULL,
    state      bigint[],
    PRIMARY KEY (namespace, key)
);
CREATE INDEX pglimit_nowait_unlogged_expires_at_idx ON pglimit_nowait_unlogged (expires_at);

-- +goose Down
DROP TABLE pglimit_nowait_unlogged;
DROP TABLE pglimit_upsert_unlogged;
