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
-- failover to it starts empty.
--
-- They have no index on expires_at, so that an admission, which changes
-- expires_at only, is a HOT update: no new index entry, and the row stays
-- in its page (fillfactor 90 leaves the room). On PostgreSQL 15, pgbench
-- (8 clients, 100k keys, every request admitted, durable settings): HOT
-- updates 0% -> 100%, +10% to +39% admissions over three alternating
-- rounds (noise-limited on a loaded machine), and the table stayed at its
-- size where the indexed copy grew 18 -> 24 MB. The cleanup job, finding no
-- index on expires_at, sweeps such a table by ranges of blocks: each batch
-- reads a few blocks, each run reads the table once.

-- +goose Up
CREATE UNLOGGED TABLE pglimit_upsert_unlogged (
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    expires_at timestamptz NOT NULL,
    state      bigint[],
    PRIMARY KEY (namespace, key)
) WITH (fillfactor = 90);

CREATE UNLOGGED TABLE pglimit_nowait_unlogged (
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    expires_at timestamptz NOT NULL,
    state      bigint[],
    PRIMARY KEY (namespace, key)
) WITH (fillfactor = 90);

-- +goose Down
DROP TABLE pglimit_nowait_unlogged;
DROP TABLE pglimit_upsert_unlogged;
