-- The demo's own table, kept apart from pglimit's migrations: an
-- application's tables are its own business. Applied at start-up under an
-- advisory lock, with search_path set to the demo's schema.

CREATE TABLE IF NOT EXISTS demo_items (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_name  text        NOT NULL,
    name       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS demo_items_user_idx ON demo_items (user_name, id);
