-- Decision ids (pglimit.WithID): one row per admitted id of a namespace,
-- written by the decision's own statement in the same transaction as the
-- units it charged, so that the two commit or roll back together. The
-- primary key is what makes a retry of the same id, on any instance, wait
-- for the first decision's commit and then charge nothing. A refusal
-- writes no row. The row keeps what the decision statement answered (the
-- key, the units, the state it decided on and the time), from which a
-- retry rebuilds the first decision. expires_at is when the id may be
-- forgotten: the decision's time plus the limiter's IDRetention; the
-- cleanup job deletes rows past it (expires_at index). done marks an id
-- refunded or settled by id (RefundID, SettleID), from any instance, at
-- most once.

-- +goose Up
CREATE TABLE pglimit_ids (
    namespace  text        NOT NULL,
    id         text        NOT NULL,
    key        text        NOT NULL,
    n          integer     NOT NULL,
    state      bigint[],  -- the general statement's state decided on; NULL for a single GCRA limit
    tat        bigint,    -- µs: the TAT written (single GCRA limit) or read (general)
    now        bigint      NOT NULL, -- µs: the database time of the decision
    expires_at timestamptz NOT NULL,
    done       text,      -- 'refunded' or 'settled' once RefundID or SettleID applied; NULL before
    mode       smallint    NOT NULL DEFAULT 0, -- the deciding statement's mode: 0 Allow, 1 AllowAtMost, 2 Reserve, 3 a level of AllowAll
    PRIMARY KEY (namespace, id)
);

CREATE INDEX pglimit_ids_expires_at_idx ON pglimit_ids (expires_at);

-- +goose Down
DROP TABLE pglimit_ids;
