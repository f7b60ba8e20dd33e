-- General limits (pglimit.Limit): N per period with a burst, fixed and
-- sliding windows, several limits on one key. They share the Upsert and
-- NoWait tables with the cooldown, one row per (namespace, key):
--
-- * expires_at stays the time from which the row holds no state any more
--   (every limit fully replenished), so the cleanup job needs no change;
-- * a single GCRA limit (the cooldown among them) keeps its theoretical
--   arrival time in expires_at alone, with state NULL;
-- * any other set of limits keeps three integers per limit in state, in the
--   order of the limiter's Limits: GCRA [tat, 0, 0], FixedWindow
--   [window start, count, 0], SlidingWindow [window start, previous count,
--   current count], times in microseconds since the Unix epoch.
--
-- pglimit_decide is the decision itself, a pure function of the row's
-- state, the database time and the request, so that the statements can
-- evaluate it as the guard of a row lock and again when they write. The
-- algorithms are defined in docs/limits.md.

-- +goose Up
ALTER TABLE pglimit_upsert ADD COLUMN state bigint[];
ALTER TABLE pglimit_nowait ADD COLUMN state bigint[];

-- +goose StatementBegin
CREATE FUNCTION pglimit_decide(
    state      bigint[], -- the row's state; NULL for a new key or a single GCRA limit
    tat        bigint,   -- the row's expires_at in microseconds; NULL for a new key
    now        bigint,   -- the database time, microseconds since the epoch
    n          bigint,   -- units asked for
    mode       integer,  -- 0: admit n or refuse; 1: admit up to n; 2: admit n within max_delay (GCRA)
    max_delay  bigint,
    spec       bigint[], -- per limit: algorithm (0 GCRA, 1 fixed, 2 sliding), period, rate, burst
    OUT allowed     boolean,
    OUT granted     bigint,
    OUT new_state   bigint[],
    OUT new_expires bigint,  -- the row's new expires_at, microseconds
    OUT remaining   bigint,
    OUT retry_us    bigint,
    OUT reset_us    bigint,
    OUT binding     integer, -- index (from 0) of the binding limit
    OUT violated    integer, -- bit i set: limit i refused
    OUT delay_us    bigint)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    nl      integer := array_length(spec, 1) / 4;
    single  boolean := nl = 1 AND spec[1] = 0;
    fresh   boolean := state IS NULL OR array_length(state, 1) IS DISTINCT FROM 3 * nl;
    alg     bigint; per bigint; rate bigint; burst bigint; t bigint;
    a bigint[] := '{}'; b bigint[] := '{}'; c bigint[] := '{}'; -- per limit: normalized state
    cap     bigint[] := '{}'; -- units each limit admits now
    u       bigint;
    ok      boolean;
    w       bigint;
    e       bigint;
    cw      bigint;
    r       bigint;
    rs      bigint;
    exp     bigint;
    best_rem bigint := NULL;
    best_retry bigint := -1;
BEGIN
    -- Roll each limit's state forward to now and measure its capacity.
    FOR i IN 1..nl LOOP
        alg := spec[4*i-3]; per := spec[4*i-2]; rate := spec[4*i-1]; burst := spec[4*i];
        IF alg = 0 THEN
            t := (per + rate - 1) / rate;
            a[i] := greatest(CASE WHEN single THEN tat WHEN fresh THEN NULL ELSE state[3*i-2] END, now);
            cap[i] := (now + burst * t - a[i]) / t;
        ELSIF alg = 1 THEN
            IF fresh OR now >= state[3*i-2] + per THEN
                a[i] := now; b[i] := 0;
            ELSE
                a[i] := state[3*i-2]; b[i] := state[3*i-1];
            END IF;
            cap[i] := rate - b[i];
        ELSE
            cw := now / per * per;
            IF NOT fresh AND state[3*i-2] = cw THEN
                b[i] := state[3*i-1]; c[i] := state[3*i];
            ELSIF NOT fresh AND state[3*i-2] = cw - per THEN
                b[i] := state[3*i]; c[i] := 0;
            ELSE
                b[i] := 0; c[i] := 0;
            END IF;
            a[i] := cw;
            cap[i] := greatest(rate - c[i] - ceil(b[i]::numeric * (per - (now - cw)) / per)::bigint, 0);
        END IF;
    END LOOP;

    u := n;
    IF mode = 1 THEN
        u := least(n, (SELECT min(x) FROM unnest(cap) x));
        IF u < 1 THEN
            u := 1; -- nothing to grant: report when one unit will be
            mode := 0;
            n := 1;
        END IF;
    END IF;

    allowed := true; violated := 0; delay_us := 0; retry_us := 0; binding := 0;
    FOR i IN 1..nl LOOP
        alg := spec[4*i-3]; per := spec[4*i-2]; rate := spec[4*i-1]; burst := spec[4*i];
        IF alg = 0 THEN
            t := (per + rate - 1) / rate;
            w := a[i] + u * t - now - burst * t; -- how far past the burst u units reach
            IF mode = 2 THEN
                ok := w <= max_delay;
                w := w - max_delay;
            ELSE
                ok := u <= cap[i];
            END IF;
        ELSIF alg = 1 THEN
            ok := u <= cap[i];
            w := a[i] + per - now;
        ELSE
            ok := u <= cap[i];
            e := now - a[i];
            IF ok THEN
                w := 0;
            ELSIF c[i] + u <= rate THEN -- wait for the previous window's weight to fall (b[i] > 0)
                w := per - floor((rate - c[i] - u)::numeric * per / b[i])::bigint - e;
            ELSE -- wait for the next window, where this one's count c[i] > 0 weighs
                w := per - e + per - floor((rate - u)::numeric * per / c[i])::bigint;
            END IF;
        END IF;
        IF NOT ok THEN
            allowed := false;
            violated := violated | (1 << (i - 1));
            IF w > best_retry THEN
                best_retry := w; binding := i - 1;
            END IF;
        END IF;
    END LOOP;
    IF NOT allowed THEN
        retry_us := best_retry;
        granted := 0;
    ELSE
        granted := u;
        new_state := CASE WHEN single THEN NULL ELSE '{}' END;
        new_expires := now;
    END IF;

    -- Advance the state if admitted; measure what remains either way.
    FOR i IN 1..nl LOOP
        alg := spec[4*i-3]; per := spec[4*i-2]; rate := spec[4*i-1]; burst := spec[4*i];
        IF alg = 0 THEN
            t := (per + rate - 1) / rate;
            IF allowed THEN
                delay_us := greatest(delay_us, a[i] + u * t - now - burst * t);
                a[i] := a[i] + u * t;
                exp := a[i];
                new_state := new_state || ARRAY[a[i], 0, 0];
            END IF;
            r := greatest((now + burst * t - a[i]) / t, 0);
            rs := greatest(a[i] - now, 0);
        ELSIF alg = 1 THEN
            IF allowed THEN
                b[i] := b[i] + u;
                exp := a[i] + per;
                new_state := new_state || ARRAY[a[i], b[i], 0];
            END IF;
            r := rate - b[i];
            rs := CASE WHEN b[i] > 0 THEN a[i] + per - now ELSE 0 END;
        ELSE
            IF allowed THEN
                c[i] := c[i] + u;
                new_state := new_state || ARRAY[a[i], b[i], c[i]];
            END IF;
            r := greatest(rate - c[i] - ceil(b[i]::numeric * (per - (now - a[i])) / per)::bigint, 0);
            rs := CASE WHEN c[i] > 0 THEN a[i] + 2 * per - now WHEN b[i] > 0 THEN a[i] + per - now ELSE 0 END;
            exp := now + rs;
        END IF;
        IF allowed THEN
            new_expires := greatest(new_expires, exp);
            IF best_rem IS NULL OR r < best_rem THEN
                best_rem := r; binding := i - 1; reset_us := rs;
            END IF;
        ELSIF i - 1 = binding THEN
            reset_us := rs;
        END IF;
        remaining := least(remaining, r);
    END LOOP;
    IF single THEN
        new_state := NULL;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pglimit_decide(bigint[], bigint, bigint, bigint, integer, bigint, bigint[]);
ALTER TABLE pglimit_nowait DROP COLUMN state;
ALTER TABLE pglimit_upsert DROP COLUMN state;
