-- A key's own limits for a while: "lift customer X's limit for an hour".
-- expires_at is when the row stops counting, on the database clock; NULL,
-- the default and what every existing row gets, means never. The decisions
-- read a row only while it counts, so a lapsed row is the same as none:
-- nothing has to delete it in time, and SetKeyLimits replaces or deletes
-- it like any other.
--
-- Adding a nullable column with no default rewrites nothing and takes the
-- table's lock only for an instant.

-- +goose Up
ALTER TABLE pglimit_overrides ADD COLUMN expires_at timestamptz;

-- +goose Down
ALTER TABLE pglimit_overrides DROP COLUMN expires_at;
