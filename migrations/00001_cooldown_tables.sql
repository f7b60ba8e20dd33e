-- Tables for the Upsert and NoWait strategies: one row per (namespace, key)
-- ever admitted, holding the database time at which its cooldown ends.

-- +goose Up
CREATE TABLE pglimit_upsert (
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (namespace, key)
);

CREATE TABLE pglimit_nowait (
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (namespace, key)
);

-- +goose Down
DROP TABLE pglimit_nowait;
DROP TABLE pglimit_upsert;
