-- The database-health throttle's statements (pglimithealth).

-- health.signal.<kind> is one signal's value, a float8 scalar subquery.
-- replication_lag: the largest replay_lag of the standbys connected now,
-- in seconds (0 with none, or while none lags).
{{define "health.signal.replication_lag"}}(SELECT coalesce(max(extract(epoch FROM replay_lag)), 0) FROM pg_stat_replication)::float8{{end}}

-- replication_lag_bytes: the most WAL, in bytes, that a connected standby
-- has still to replay.
{{define "health.signal.replication_lag_bytes"}}(SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)), 0) FROM pg_stat_replication)::float8{{end}}

-- active_sessions: client sessions running a statement, the sampler's own
-- excepted, as a fraction of max_connections.
{{define "health.signal.active_sessions"}}((SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid())::float8 / current_setting('max_connections')::float8){{end}}

-- lock_waiters: sessions waiting for a heavyweight lock.
{{define "health.signal.lock_waiters"}}(SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock')::float8{{end}}

-- wal_rate: WAL bytes a second written since the throttle's previous
-- sample (by any leader), read from the WAL position that sample stored;
-- 0 at the first. {{.health}} is the state table, $1 the throttle's name.
{{define "health.signal.wal_rate"}}coalesce((SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), h.wal_lsn) / nullif(extract(epoch FROM now() - h.sampled_at), 0) FROM {{.health}} h WHERE h.name = $1), 0)::float8{{end}}

-- standby_replay_delay: the largest replay delay of the standbys, which
-- the leader read on each of them just before (health.standby) and passes
-- as $10: +Infinity for one it could not read.
{{define "health.signal.standby_replay_delay"}}$10::float8{{end}}

-- health.standby runs on each standby of a StandbyReplayDelay signal:
-- whether the server is in recovery, whether the role may read
-- pg_stat_wal_receiver's status (pg_read_all_stats), and the replay delay
-- in seconds: 0 while its WAL receiver streams and it has replayed all it
-- received; otherwise the age of the last transaction it replayed, on its
-- own clock (NULL, so unknown, when it replayed none since it started).
-- The throttle's own sample commits every period on the primary, so a
-- standby that keeps up replays a transaction at least that often. The
-- functions are those of PostgreSQL 10 and later.
{{define "health.standby"}}
SELECT pg_is_in_recovery(), pg_has_role('pg_read_all_stats', 'USAGE'),
       CASE WHEN pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()
                 AND coalesce((SELECT status = 'streaming' FROM pg_stat_wal_receiver), false)
            THEN 0
            ELSE extract(epoch FROM now() - pg_last_xact_replay_timestamp())
       END::float8
{{end}}

-- health.sample is the whole period's work, one statement on the leader's
-- session: it samples the signals ({{.signals}}, rows of (signal, value,
-- threshold)), applies the rule to the rate the throttle's row holds
-- (the ceiling if none), and writes the new rate to the throttle key's
-- overrides row (no expiry) and the state to pglimit_health.
--   $1 name, $2 floor, $3 ceiling, $4 increase, $5 decrease,
--   $6 namespace, $7 key, $8 limit name, $9 leader id, and $10 the
--   standbys' replay delay where a signal reads it.
-- The rule: over = (value > threshold for the worst signal);
--   over:     rate' = max(floor, floor(rate * decrease))
--   not over: rate' = min(ceiling, rate + increase)
-- and rate' is clamped to [floor, ceiling] (a changed configuration).
{{define "health.sample"}}
WITH sample AS (
    SELECT s.signal, s.value, s.threshold
    FROM (VALUES {{.signals}}) AS s(signal, value, threshold)
    ORDER BY s.value / s.threshold DESC, s.signal
    LIMIT 1
), prev AS (
    SELECT rate, since, samples FROM {{.health}} WHERE name = $1
), next AS (
    SELECT s.signal, s.value, s.threshold, s.value > s.threshold AS over,
           greatest($2::bigint, least($3::bigint,
               CASE WHEN s.value > s.threshold
                    THEN floor(coalesce(p.rate, $3::bigint) * $5::float8)::bigint
                    ELSE coalesce(p.rate, $3::bigint) + $4::bigint
               END)) AS rate,
           p.rate AS prev_rate, p.since, coalesce(p.samples, 0) AS samples
    FROM sample s LEFT JOIN prev p ON true
), limits AS (
    INSERT INTO {{.overrides}} AS o (namespace, key, limits)
    SELECT $6, $7, jsonb_build_object($8::text, jsonb_build_object('rate', rate)) FROM next
    ON CONFLICT (namespace, key) DO UPDATE
        SET limits = o.limits || excluded.limits, updated_at = now(), expires_at = NULL
        WHERE o.limits -> $8::text IS DISTINCT FROM excluded.limits -> $8::text OR o.expires_at IS NOT NULL
)
INSERT INTO {{.health}} AS h (name, rate, over, signal, value, threshold, samples, sampled_at, since, leader, wal_lsn)
SELECT $1, rate, over, signal, value, threshold, samples + 1, now(),
       CASE WHEN prev_rate IS DISTINCT FROM rate THEN now() ELSE since END, $9, pg_current_wal_lsn()
FROM next
ON CONFLICT (name) DO UPDATE
    SET rate = excluded.rate, over = excluded.over, signal = excluded.signal, value = excluded.value,
        threshold = excluded.threshold, samples = excluded.samples, sampled_at = excluded.sampled_at,
        since = excluded.since, leader = excluded.leader, wal_lsn = excluded.wal_lsn
RETURNING name, rate, over, signal, value, threshold, samples, sampled_at, since, leader
{{end}}

-- health.state reads the throttles' state: $1 a name, or NULL for all.
{{define "health.state"}}
SELECT name, rate, over, signal, value, threshold, samples, sampled_at, since, leader
FROM {{.health}}
WHERE $1::text IS NULL OR name = $1
ORDER BY name
{{end}}

-- health.session bounds the leader's statements on its session, and says
-- whether its role may read every session's and standby's statistics:
-- without pg_read_all_stats (pg_monitor has it), pg_stat_activity hides
-- other roles' state and wait events, and pg_stat_replication their lag,
-- so every signal would read low.
{{define "health.session"}}
SELECT set_config('statement_timeout', $1, false), pg_has_role('pg_read_all_stats', 'USAGE')
{{end}}
