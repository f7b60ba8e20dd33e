-- Table for the Range strategy: one row per admission. The exclusion
-- constraint forbids two overlapping cooldowns for the same (namespace, key),
-- which is the whole limiter. btree_gist supplies the gist operator class for
-- the text equality columns; it ships with PostgreSQL's contrib modules.
--
-- The extension is not created here: a database holds it once, in one
-- schema, and created from here it would land in the schema being migrated,
-- so dropping that schema would drop it and the constraint of every other
-- Range table with it. pglimit.Migrate creates it first, in a schema of its
-- own (pglimit_ext), when the role may; with the goose CLI, create it once
-- beforehand:
--   CREATE SCHEMA pglimit_ext; CREATE EXTENSION btree_gist SCHEMA pglimit_ext;
-- A gist index finds the default operator class wherever it lives, so that
-- schema need not be on the search_path.
--
-- Without the extension the table is created without its constraint, so
-- that an application that never uses Range migrates with privileges on its
-- schema alone. A Range limiter refuses to decide on such a table
-- (ErrNoExclusionConstraint, naming the extension), and the first Migrate
-- after the extension is installed adds the constraint.

-- +goose Up
CREATE TABLE pglimit_range (
    namespace text      NOT NULL,
    key       text      NOT NULL,
    during    tstzrange NOT NULL
);

-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'btree_gist') THEN
        ALTER TABLE pglimit_range ADD CONSTRAINT pglimit_range_no_overlap
            EXCLUDE USING gist (namespace WITH =, key WITH =, during WITH &&);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE pglimit_range;
