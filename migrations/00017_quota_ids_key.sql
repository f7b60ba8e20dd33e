-- An index of pglimit_quota_ids by key, so that pglimitquota's Forget,
-- which deletes every id of one key, reads that key's ids instead of
-- scanning the table. It costs each admission with an id one more index
-- entry (docs/limits.md, "Billing periods", Growth); an admission
-- without an id does not touch the table.
--
-- The key leads, not the namespace: an index led by the namespace serves
-- "namespace = $1" too, and a generic plan made while the table was small
-- looked ids up through it, scanning every id of the namespace on every
-- decision with an id, instead of through the primary key.
--
-- CONCURRENTLY, so that upgrading a deployment whose ids table is
-- already large never blocks admissions while the index builds. That
-- cannot run in a transaction; a build that failed half way leaves an
-- invalid index, which the DROP removes when the migration is run again.

-- +goose NO TRANSACTION
-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS pglimit_quota_ids_key_idx;
CREATE INDEX CONCURRENTLY pglimit_quota_ids_key_idx ON pglimit_quota_ids (key, namespace);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS pglimit_quota_ids_key_idx;
