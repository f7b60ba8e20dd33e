-- The state of each database-health throttle (pglimithealth): its rate
-- now, and why. One row per throttle name, written by the throttle's
-- elected leader once per sampling period, read by every instance's
-- operator command. The rate itself reaches the limiters through
-- pglimit_overrides, which the same statement writes.
--
-- signal, value and threshold are the sample's worst signal (the largest
-- value/threshold); over is whether it passed its threshold, which made
-- the rate decrease. samples counts the samples taken, since is when the
-- rate last changed, leader is the id of the instance that sampled, and
-- wal_lsn the primary's WAL position then (for WAL bytes a second).

-- +goose Up
CREATE TABLE pglimit_health (
    name       text             PRIMARY KEY,
    rate       bigint           NOT NULL CHECK (rate >= 1),
    over       boolean          NOT NULL,
    signal     text             NOT NULL,
    value      double precision NOT NULL,
    threshold  double precision NOT NULL,
    samples    bigint           NOT NULL DEFAULT 1,
    sampled_at timestamptz      NOT NULL,
    since      timestamptz      NOT NULL,
    leader     text             NOT NULL,
    wal_lsn    pg_lsn           NOT NULL
);

-- +goose Down
DROP TABLE pglimit_health;
