-- Citus: the PL/pgSQL functions that Distribute installs on a distributed
-- table, the calls that replace the plain statements there, and the
-- statements of Distribute and of detection (pglimit's citus.go says
-- why a function per decision).
--
-- The function templates: placeholders table, function (its name), decide
-- (the schema's pglimit_decide, migration 00004). They turn a timestamptz
-- into microseconds since the epoch as the plain statements do.
--
-- Every function plans its statements afresh on each call
-- (plan_cache_mode = force_custom_plan). With a cached generic plan,
-- Citus 12.1.11+, 13.2.1+ and 14.0 build the statement's local shard plan
-- again on every execution and keep each one in the cached plan, 30 to
-- 40 kB a statement, for as long as the coordinator's connection lives
-- (citusdata/citus#8824). A custom plan costs the same time there and
-- keeps nothing.

{{define "citus.row_allow"}}
CREATE OR REPLACE FUNCTION {{.function}}(
    p_namespace text, p_key text, p_step bigint, p_lock_class integer, p_tau bigint,
    p_nowait boolean, p_async boolean, p_lock_timeout text)
RETURNS TABLE (admitted boolean, tat_us bigint, now_us bigint, setting text)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $fn$
{{template "citus.single_head"}}    <<decide>>
    BEGIN
        SELECT t.expires_at INTO v_at FROM {{.table}} AS t WHERE t.namespace = p_namespace AND t.key = p_key;
        IF FOUND THEN
            v_now := clock_timestamp();
            IF v_at > v_now + p_tau * interval '1 microsecond' THEN
                admitted := false;
                EXIT decide;
            END IF;
            IF p_nowait THEN
                SELECT t.expires_at INTO v_at FROM {{.table}} AS t
                WHERE t.namespace = p_namespace AND t.key = p_key FOR UPDATE NOWAIT;
            ELSE
                SELECT t.expires_at INTO v_at FROM {{.table}} AS t
                WHERE t.namespace = p_namespace AND t.key = p_key FOR UPDATE;
            END IF;
            IF NOT FOUND THEN
                EXIT decide;
            END IF;
            v_now := clock_timestamp();
            IF v_at > v_now + p_tau * interval '1 microsecond' THEN
                EXIT decide;
            END IF;
            v_at := greatest(v_at, v_now) + p_step * interval '1 microsecond';
            UPDATE {{.table}} AS t SET expires_at = v_at WHERE t.namespace = p_namespace AND t.key = p_key;
            admitted := true;
        ELSE
            PERFORM pg_advisory_xact_lock(p_lock_class, hashtext(p_key));
            v_now := clock_timestamp();
            v_at := v_now + p_step * interval '1 microsecond';
            INSERT INTO {{.table}} (namespace, key, expires_at) VALUES (p_namespace, p_key, v_at)
            ON CONFLICT (namespace, key) DO NOTHING;
            IF FOUND THEN
                admitted := true;
            END IF;
        END IF;
    END;
{{template "citus.single_tail"}}
{{end}}

{{define "citus.row_decide"}}
CREATE OR REPLACE FUNCTION {{.function}}(
    p_namespace text, p_key text, p_lock_class integer, p_n bigint, p_mode integer,
    p_max_delay bigint, p_spec bigint[], p_nowait boolean, p_async boolean, p_lock_timeout text)
RETURNS TABLE (admitted boolean, state_read bigint[], tat_us bigint, now_us bigint, setting text)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
    v_saved text := current_setting('lock_timeout');
    v_state bigint[];
    v_at    timestamptz;
    v_now   bigint;
    d       record;
BEGIN
    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
    END IF;
    <<decide>>
    BEGIN
        SELECT t.state, t.expires_at INTO v_state, v_at FROM {{.table}} AS t
        WHERE t.namespace = p_namespace AND t.key = p_key;
        IF FOUND THEN
            v_now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
            SELECT * INTO d FROM {{.decide}}(v_state, (extract(epoch FROM v_at) * 1000000)::bigint, v_now,
                                       p_n, p_mode, p_max_delay, p_spec);
            IF NOT d.allowed THEN
                admitted := false;
                EXIT decide;
            END IF;
            IF p_nowait THEN
                SELECT t.state, t.expires_at INTO v_state, v_at FROM {{.table}} AS t
                WHERE t.namespace = p_namespace AND t.key = p_key FOR UPDATE NOWAIT;
            ELSE
                SELECT t.state, t.expires_at INTO v_state, v_at FROM {{.table}} AS t
                WHERE t.namespace = p_namespace AND t.key = p_key FOR UPDATE;
            END IF;
            IF NOT FOUND THEN
                EXIT decide;
            END IF;
            v_now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
            SELECT * INTO d FROM {{.decide}}(v_state, (extract(epoch FROM v_at) * 1000000)::bigint, v_now,
                                       p_n, p_mode, p_max_delay, p_spec);
            IF NOT d.allowed THEN
                EXIT decide;
            END IF;
            UPDATE {{.table}} AS t
            SET state = d.new_state, expires_at = timestamptz 'epoch' + d.new_expires * interval '1 microsecond'
            WHERE t.namespace = p_namespace AND t.key = p_key;
            admitted := true;
        ELSE
            PERFORM pg_advisory_xact_lock(p_lock_class, hashtext(p_key));
            v_now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
            SELECT * INTO d FROM {{.decide}}(NULL, NULL, v_now, p_n, p_mode, p_max_delay, p_spec);
            IF d.allowed THEN
                INSERT INTO {{.table}} (namespace, key, state, expires_at)
                VALUES (p_namespace, p_key, d.new_state, timestamptz 'epoch' + d.new_expires * interval '1 microsecond')
                ON CONFLICT (namespace, key) DO NOTHING;
                IF NOT FOUND THEN
                    EXIT decide;
                END IF;
            END IF;
            admitted := d.allowed;
        END IF;
    END;
    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', v_saved, true);
    END IF;
    IF admitted IS NULL THEN
        RETURN;
    END IF;
    state_read := v_state;
    tat_us := (extract(epoch FROM v_at) * 1000000)::bigint;
    now_us := v_now;
    IF admitted AND p_async THEN
        setting := set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN NEXT;
END
$fn$
{{end}}

-- citus.single_head begins the functions of a single GCRA limit on both
-- kinds of table: their variables, and the caller's lock_timeout, kept in
-- v_saved, replaced by p_lock_timeout in a caller's transaction.
{{define "citus.single_head"}}DECLARE
    v_saved text := current_setting('lock_timeout');
    v_at    timestamptz;
    v_now   timestamptz;
BEGIN
    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
    END IF;
{{end}}

-- citus.single_tail ends the functions of a single GCRA limit on both kinds of table, once
-- their decision is in admitted (NULL: the key changed, decide again),
-- v_at and v_now: it restores the caller's lock_timeout and answers.
{{define "citus.single_tail"}}
    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', v_saved, true);
    END IF;
    IF admitted IS NULL THEN
        RETURN;
    END IF;
    tat_us := (extract(epoch FROM v_at) * 1000000)::bigint;
    now_us := (extract(epoch FROM v_now) * 1000000)::bigint;
    IF admitted AND p_async THEN
        setting := set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN NEXT;
END
$fn${{end}}

{{define "citus.row_peek"}}
CREATE OR REPLACE FUNCTION {{.function}}(p_namespace text, p_key text)
RETURNS TABLE (admitted boolean, state_read bigint[], tat_us bigint, now_us bigint, setting text)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $fn$
BEGIN
    SELECT t.state, (extract(epoch FROM t.expires_at) * 1000000)::bigint INTO state_read, tat_us FROM {{.table}} AS t
    WHERE t.namespace = p_namespace AND t.key = p_key;
    now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    RETURN NEXT;
END
$fn$
{{end}}

{{define "citus.range_allow"}}
CREATE OR REPLACE FUNCTION {{.function}}(
    p_namespace text, p_key text, p_step bigint, p_lock_class integer, p_async boolean, p_lock_timeout text)
RETURNS TABLE (admitted boolean, tat_us bigint, now_us bigint, setting text)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $fn$
{{template "citus.single_head"}}    <<decide>>
    BEGIN
        v_now := clock_timestamp();
        SELECT upper(t.during) INTO v_at FROM {{.table}} AS t
        WHERE t.namespace = p_namespace AND t.key = p_key AND t.during && tstzrange(v_now, NULL)
        ORDER BY upper(t.during) DESC
        LIMIT 1;
        IF FOUND THEN
            admitted := false;
            EXIT decide;
        END IF;
        PERFORM pg_advisory_xact_lock(p_lock_class, hashtext(p_key));
        v_now := clock_timestamp();
        v_at := v_now + p_step * interval '1 microsecond';
        INSERT INTO {{.table}} (namespace, key, during) VALUES (p_namespace, p_key, tstzrange(v_now, v_at))
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            admitted := true;
        END IF;
    END;
{{template "citus.single_tail"}}
{{end}}

{{define "citus.range_peek"}}
CREATE OR REPLACE FUNCTION {{.function}}(p_namespace text, p_key text)
RETURNS TABLE (tat_us bigint, now_us bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    SELECT (extract(epoch FROM max(upper(t.during))) * 1000000)::bigint INTO tat_us FROM {{.table}} AS t
    WHERE t.namespace = p_namespace AND t.key = p_key AND t.during && tstzrange(v_now, NULL);
    now_us := (extract(epoch FROM v_now) * 1000000)::bigint;
    RETURN NEXT;
END
$fn$
{{end}}

-- The calls of the functions, with the plain statements' parameters and
-- answers. Placeholders: function; nowait, whether to wait 20 ms at most;
-- tail, the last arguments: asynchronous commit and the lock_timeout
-- (NULL in the statement's own transaction, the limiter's Timeout in a
-- caller's); for citus.call.decide, mode, max_delay and spec (the limits,
-- as pglimit_decide reads them).
{{define "citus.call.range_allow"}}SELECT * FROM {{.function}}($1, $2, $3, $4, {{.tail}}){{end}}
{{define "citus.call.row_allow"}}SELECT * FROM {{.function}}($1, $2, $3, $4, $5, {{.nowait}}, {{.tail}}){{end}}
{{define "citus.call.decide"}}SELECT * FROM {{.function}}($1, $2, $3, $4, {{.mode}}, {{.max_delay}}, {{.spec}}, {{.nowait}}, {{.tail}}){{end}}
{{define "citus.call.peek"}}SELECT * FROM {{.function}}($1, $2){{end}}

-- Distribute's statements. citus.table_state: whether table $1 exists,
-- and whether Citus distributes it. citus.delegate: the key ($2) routes
-- each call of function $1 to its shard's node; force delegation lets a
-- call in a caller's transaction go there too.
{{define "citus.installed_here"}}SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus'){{end}}
{{define "citus.distribute_decide"}}SELECT create_distributed_function($1){{end}}
{{define "citus.table_state"}}
SELECT to_regclass($1) IS NOT NULL,
       EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1))
{{end}}
{{define "citus.distribute_table"}}SELECT create_distributed_table($1, 'key', colocate_with := $2){{end}}
{{define "citus.delegate"}}SELECT create_distributed_function($1, '$2', colocate_with := $2, force_delegation := true){{end}}

-- Detection: citus.present, whether the server runs Citus at all (one
-- catalog lookup); citus.distributed, whether table $1 is distributed and
-- function $2 delegated.
{{define "citus.present"}}SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL{{end}}
{{define "citus.distributed"}}
SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1)),
       EXISTS (SELECT FROM pg_catalog.pg_dist_object
               WHERE classid = 'pg_catalog.pg_proc'::regclass AND objid = to_regprocedure($2)
                 AND distribution_argument_index IS NOT NULL)
{{end}}
