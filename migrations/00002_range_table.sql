-- Table for the Range strategy: one row per admission. The exclusion
-- constraint forbids two overlapping cooldowns for the same (namespace, key),
-- which is the whole limiter. btree_gist supplies the gist operator class for
-- the text equality columns; it ships with PostgreSQL's contrib modules and is
-- a trusted extension, so a role with CREATE on the database may create it.

-- +goose Up
CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE pglimit_range (
    namespace text      NOT NULL,
    key       text      NOT NULL,
    during    tstzrange NOT NULL,
    CONSTRAINT pglimit_range_no_overlap
        EXCLUDE USING gist (namespace WITH =, key WITH =, during WITH &&)
);

-- +goose Down
DROP TABLE pglimit_range;
