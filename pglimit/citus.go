package pglimit

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Citus splits the one-statement CTEs of a plain table into subplans, a
// network hop each, and evaluates parts of them on different nodes. On a
// table that Citus distributes by key, a decision is instead one call of a
// PL/pgSQL function that Citus delegates to the node holding the key's
// shard (create_distributed_function with the key as its distribution
// argument): one hop, and every statement of the function reads one shard
// on that node, with one clock. [Distribute] installs the functions; a
// limiter finds out on its first decision whether its table is distributed
// and then calls them instead of its plain statements.
//
// Each function keeps the plain statement's promises in single-shard steps:
// the key's row read without a lock, which is the answer when it refuses
// (no lock, no write); if it admits, the row locked and the decision made
// again at one clock reading taken after the lock, which is what the UPDATE
// writes; for a key with no row, the key's advisory lock before the clock
// is read, then INSERT ... ON CONFLICT DO NOTHING. A key changed between the
// read and the lock (a concurrent admission, Reset or cleanup) returns no
// row, and the caller runs the call again, as it does for the plain
// statement.
//
// In a caller's transaction (AllowTx), Citus delegates only functions
// distributed with force_delegation: the call then runs on the key's node
// inside the caller's distributed transaction, so the units are consumed
// only if it commits. The function bounds its own lock waits there
// (lock_timeout, given by the caller and restored before it returns), since
// the coordinator's setting does not reach the worker.

// distributedTables are the tables the migrations create, which Distribute
// distributes by key, the first one's colocation group for all.
var distributedTables = []string{
	"pglimit_upsert", "pglimit_nowait", "pglimit_range", "pglimit_upsert_unlogged", "pglimit_nowait_unlogged",
}

// Function names are the table's name with a suffix; the signatures are
// what create_distributed_function and the detection look up.
const (
	allowSuffix  = "_allow"
	decideSuffix = "_decide"
	peekSuffix   = "_peek"

	rowAllowArgs   = "(text,text,bigint,integer,bigint,boolean,boolean,text)"
	rowDecideArgs  = "(text,text,integer,bigint,integer,bigint,bigint[],boolean,boolean,text)"
	rowPeekArgs    = "(text,text)"
	rangeAllowArgs = "(text,text,bigint,integer,boolean,text)"
	rangePeekArgs  = "(text,text)"
	decideArgs     = "(bigint[],bigint,bigint,bigint,integer,bigint,bigint[])"
)

// The function templates: %[1]s is the table, %[2]s the function, %[3]s
// the schema's pglimit_decide. They turn a timestamptz into microseconds
// since the epoch as the plain statements do.
const (
	rowAllowFunc = `
CREATE OR REPLACE FUNCTION %[2]s(
    p_namespace text, p_key text, p_step bigint, p_lock_class integer, p_tau bigint,
    p_nowait boolean, p_async boolean, p_lock_timeout text)
RETURNS TABLE (admitted boolean, tat_us bigint, now_us bigint, setting text)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_saved text := current_setting('lock_timeout');
    v_at    timestamptz;
    v_now   timestamptz;
BEGIN
    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
    END IF;
    <<decide>>
    BEGIN
        SELECT t.expires_at INTO v_at FROM %[1]s AS t WHERE t.namespace = p_namespace AND t.key = p_key;
        IF FOUND THEN
            v_now := clock_timestamp();
            IF v_at > v_now + p_tau * interval '1 microsecond' THEN
                admitted := false;
                EXIT decide;
            END IF;
            IF p_nowait THEN
                SELECT t.expires_at INTO v_at FROM %[1]s AS t
                WHERE t.namespace = p_namespace AND t.key = p_key FOR UPDATE NOWAIT;
            ELSE
                SELECT t.expires_at INTO v_at FROM %[1]s AS t
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
            UPDATE %[1]s AS t SET expires_at = v_at WHERE t.namespace = p_namespace AND t.key = p_key;
            admitted := true;
        ELSE
            PERFORM pg_advisory_xact_lock(p_lock_class, hashtext(p_key));
            v_now := clock_timestamp();
            v_at := v_now + p_step * interval '1 microsecond';
            INSERT INTO %[1]s (namespace, key, expires_at) VALUES (p_namespace, p_key, v_at)
            ON CONFLICT (namespace, key) DO NOTHING;
            IF FOUND THEN
                admitted := true;
            END IF;
        END IF;
    END;
` + cooldownFuncTail

	rowDecideFunc = `
CREATE OR REPLACE FUNCTION %[2]s(
    p_namespace text, p_key text, p_lock_class integer, p_n bigint, p_mode integer,
    p_max_delay bigint, p_spec bigint[], p_nowait boolean, p_async boolean, p_lock_timeout text)
RETURNS TABLE (admitted boolean, state_read bigint[], tat_us bigint, now_us bigint, setting text)
LANGUAGE plpgsql AS $fn$
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
        SELECT t.state, t.expires_at INTO v_state, v_at FROM %[1]s AS t
        WHERE t.namespace = p_namespace AND t.key = p_key;
        IF FOUND THEN
            v_now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
            SELECT * INTO d FROM %[3]s(v_state, (extract(epoch FROM v_at) * 1000000)::bigint, v_now,
                                       p_n, p_mode, p_max_delay, p_spec);
            IF NOT d.allowed THEN
                admitted := false;
                EXIT decide;
            END IF;
            IF p_nowait THEN
                SELECT t.state, t.expires_at INTO v_state, v_at FROM %[1]s AS t
                WHERE t.namespace = p_namespace AND t.key = p_key FOR UPDATE NOWAIT;
            ELSE
                SELECT t.state, t.expires_at INTO v_state, v_at FROM %[1]s AS t
                WHERE t.namespace = p_namespace AND t.key = p_key FOR UPDATE;
            END IF;
            IF NOT FOUND THEN
                EXIT decide;
            END IF;
            v_now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
            SELECT * INTO d FROM %[3]s(v_state, (extract(epoch FROM v_at) * 1000000)::bigint, v_now,
                                       p_n, p_mode, p_max_delay, p_spec);
            IF NOT d.allowed THEN
                EXIT decide;
            END IF;
            UPDATE %[1]s AS t
            SET state = d.new_state, expires_at = timestamptz 'epoch' + d.new_expires * interval '1 microsecond'
            WHERE t.namespace = p_namespace AND t.key = p_key;
            admitted := true;
        ELSE
            PERFORM pg_advisory_xact_lock(p_lock_class, hashtext(p_key));
            v_now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
            SELECT * INTO d FROM %[3]s(NULL, NULL, v_now, p_n, p_mode, p_max_delay, p_spec);
            IF d.allowed THEN
                INSERT INTO %[1]s (namespace, key, state, expires_at)
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
$fn$`

	// cooldownFuncTail ends the cooldown functions of both tables, once
	// their decision is in admitted (NULL: the key changed, decide again),
	// v_at and v_now: it restores the caller's lock_timeout and answers.
	cooldownFuncTail = `
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
$fn$`

	rowPeekFunc = `
CREATE OR REPLACE FUNCTION %[2]s(p_namespace text, p_key text)
RETURNS TABLE (admitted boolean, state_read bigint[], tat_us bigint, now_us bigint, setting text)
LANGUAGE plpgsql AS $fn$
BEGIN
    SELECT t.state, (extract(epoch FROM t.expires_at) * 1000000)::bigint INTO state_read, tat_us FROM %[1]s AS t
    WHERE t.namespace = p_namespace AND t.key = p_key;
    now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    RETURN NEXT;
END
$fn$`

	rangeAllowFunc = `
CREATE OR REPLACE FUNCTION %[2]s(
    p_namespace text, p_key text, p_step bigint, p_lock_class integer, p_async boolean, p_lock_timeout text)
RETURNS TABLE (admitted boolean, tat_us bigint, now_us bigint, setting text)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_saved text := current_setting('lock_timeout');
    v_at    timestamptz;
    v_now   timestamptz;
BEGIN
    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
    END IF;
    <<decide>>
    BEGIN
        v_now := clock_timestamp();
        SELECT upper(t.during) INTO v_at FROM %[1]s AS t
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
        INSERT INTO %[1]s (namespace, key, during) VALUES (p_namespace, p_key, tstzrange(v_now, v_at))
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            admitted := true;
        END IF;
    END;
` + cooldownFuncTail

	rangePeekFunc = `
CREATE OR REPLACE FUNCTION %[2]s(p_namespace text, p_key text)
RETURNS TABLE (tat_us bigint, now_us bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    SELECT (extract(epoch FROM max(upper(t.during))) * 1000000)::bigint INTO tat_us FROM %[1]s AS t
    WHERE t.namespace = p_namespace AND t.key = p_key AND t.during && tstzrange(v_now, NULL);
    now_us := (extract(epoch FROM v_now) * 1000000)::bigint;
    RETURN NEXT;
END
$fn$`
)

// Distribute makes the limiter tables of schema ("" means "public"), which
// [Migrate] created, Citus distributed tables sharded by key, all in one
// colocation group, and installs the functions that decide in one hop on
// the node that holds a key (see docs/citus.md). Run it on the coordinator
// after Migrate, and again after every Migrate that applied a migration; it
// is idempotent, and serialized between instances. Limiters need no other
// change: each finds out on its first decision that its table is
// distributed. Without the citus extension it returns an error wrapping
// [ErrUnsupported] and changes nothing.
func Distribute(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	schema = cmp.Or(schema, defaultSchema)
	if err := ValidateIdentifier(schema); err != nil {
		return fmt.Errorf("%w: schema: %w", ErrInvalidConfig, err)
	}
	// A connection of its own, whose close releases the session lock.
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		return fmt.Errorf("pglimit: distribute: %w", err)
	}
	defer conn.Close(context.Background())
	var citus bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')").Scan(&citus); err != nil {
		return fmt.Errorf("pglimit: distribute: %w", err)
	}
	if !citus {
		return fmt.Errorf("%w: distribute: the citus extension is not installed in this database (CREATE EXTENSION citus, on a Citus cluster's coordinator)", ErrUnsupported)
	}
	err = pollLock(ctx, func() (got bool, err error) {
		err = conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", distributeLockID).Scan(&got)
		return got, err
	})
	if err != nil {
		return fmt.Errorf("pglimit: distribute: lock: %w", err)
	}
	if err := distribute(ctx, conn, schema); err != nil {
		return fmt.Errorf("pglimit: distribute %s: %w", schema, err)
	}
	return nil
}

func distribute(ctx context.Context, conn *pgx.Conn, schema string) error {
	decide := pgx.Identifier{schema, "pglimit_decide"}.Sanitize()
	if _, err := conn.Exec(ctx, "SELECT create_distributed_function($1)", decide+decideArgs); err != nil {
		return fmt.Errorf("distribute pglimit_decide (run Migrate first): %w", err)
	}
	first := pgx.Identifier{schema, distributedTables[0]}.Sanitize()
	for _, name := range distributedTables {
		table := pgx.Identifier{schema, name}.Sanitize()
		var exists, distributed bool
		err := conn.QueryRow(ctx, `
SELECT to_regclass($1) IS NOT NULL,
       EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1))`, table).Scan(&exists, &distributed)
		switch {
		case err != nil:
			return err
		case !exists:
			return fmt.Errorf("table %s does not exist; run pglimit.Migrate on the schema first", table)
		case !distributed:
			colocate := first
			if name == distributedTables[0] {
				colocate = "default"
			}
			if _, err := conn.Exec(ctx, "SELECT create_distributed_table($1, 'key', colocate_with := $2)", table, colocate); err != nil {
				return fmt.Errorf("distribute %s: %w", table, err)
			}
		}
		for _, f := range tableFunctions(name) {
			fn := pgx.Identifier{schema, name + f.suffix}.Sanitize()
			if _, err := conn.Exec(ctx, fmt.Sprintf(f.template, table, fn, decide)); err != nil {
				return fmt.Errorf("create %s: %w", fn, err)
			}
			// The key ($2) routes each call to its shard's node; force
			// delegation lets a call in a caller's transaction go there too.
			if _, err := conn.Exec(ctx, `SELECT create_distributed_function($1, '$2', colocate_with := $2, force_delegation := true)`,
				fn+f.args, table); err != nil {
				return fmt.Errorf("distribute %s: %w", fn, err)
			}
		}
	}
	return nil
}

type tableFunction struct{ suffix, args, template string }

// tableFunctions lists the functions of a table: Range's, or those of a
// table of one row per key.
func tableFunctions(table string) []tableFunction {
	if table == rangeTable {
		return []tableFunction{
			{allowSuffix, rangeAllowArgs, rangeAllowFunc},
			{peekSuffix, rangePeekArgs, rangePeekFunc},
		}
	}
	return []tableFunction{
		{allowSuffix, rowAllowArgs, rowAllowFunc},
		{decideSuffix, rowDecideArgs, rowDecideFunc},
		{peekSuffix, rowPeekArgs, rowPeekFunc},
	}
}

// distributedStatements are the limiter's statements on a distributed
// table: calls of its functions, with the same parameters and answers as
// the plain statements. A call in a caller's transaction passes the
// limiter's Timeout as the function's lock_timeout.
func (l *stmtLimiter) distributedStatements() statements {
	c := l.cfg
	fn := func(suffix string) string { return pgx.Identifier{c.Schema, c.Table + suffix}.Sanitize() }
	ms := (c.Timeout + time.Millisecond - 1) / time.Millisecond // rounded up: 0 would disable it
	inTx := fmt.Sprintf("false, '%dms'", ms)
	own := fmt.Sprintf("%t, NULL", c.AsyncCommit)
	if l.plain.general == nil { // Range
		return statements{
			fast:   fmt.Sprintf("SELECT * FROM %s($1, $2, $3, $4, %s)", fn(allowSuffix), own),
			fastTx: fmt.Sprintf("SELECT * FROM %s($1, $2, $3, $4, %s)", fn(allowSuffix), inTx),
			peek:   fmt.Sprintf("SELECT * FROM %s($1, $2)", fn(peekSuffix)),
		}
	}
	nowait := c.Strategy == NoWait
	g := &generalStatements{peek: fmt.Sprintf("SELECT * FROM %s($1, $2)", fn(peekSuffix))}
	for mode := range modes {
		maxDelay := "0"
		if mode == modeReserve {
			maxDelay = "$5"
		}
		call := fmt.Sprintf("SELECT * FROM %s($1, $2, $3, $4, %d, %s, %s, %t, ", fn(decideSuffix), mode, maxDelay, specArray(c.Limits), nowait)
		g.own[mode], g.tx[mode] = call+own+")", call+inTx+")"
	}
	return statements{
		fast:    fmt.Sprintf("SELECT * FROM %s($1, $2, $3, $4, $5, %t, %s)", fn(allowSuffix), nowait, own),
		fastTx:  fmt.Sprintf("SELECT * FROM %s($1, $2, $3, $4, $5, %t, %s)", fn(allowSuffix), nowait, inTx),
		general: g,
		peek:    g.peek,
	}
}

// specArray is limits as the migrations' pglimit_decide reads them, an
// array literal of validated integers: algorithm, period (µs), rate and
// burst per limit.
func specArray(limits []Limit) string {
	parts := make([]string, 0, 4*len(limits))
	for _, l := range limits {
		parts = append(parts, strconv.Itoa(int(l.Algorithm)), strconv.FormatInt(l.Period.Microseconds(), 10), strconv.Itoa(l.Rate), strconv.Itoa(l.Burst))
	}
	return "ARRAY[" + strings.Join(parts, ", ") + "]::bigint[]"
}

// detectDistributed finds out whether the limiter's table is a Citus
// distributed table and, if so, switches the limiter to its functions. On
// plain PostgreSQL it costs one catalog lookup, once.
func (l *stmtLimiter) detectDistributed(ctx context.Context, db DB) error {
	var citus bool
	if err := db.QueryRow(ctx, "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL").Scan(&citus); err != nil {
		return err // the limiter's first statement: a connection error, mostly
	}
	if !citus {
		return nil
	}
	table := pgx.Identifier{l.cfg.Schema, l.cfg.Table}.Sanitize()
	args := rowAllowArgs
	if l.plain.general == nil {
		args = rangeAllowArgs
	}
	fn := pgx.Identifier{l.cfg.Schema, l.cfg.Table + allowSuffix}.Sanitize() + args
	var distributed, delegated bool
	err := db.QueryRow(ctx, `
SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1)),
       EXISTS (SELECT FROM pg_catalog.pg_dist_object
               WHERE classid = 'pg_catalog.pg_proc'::regclass AND objid = to_regprocedure($2)
                 AND distribution_argument_index IS NOT NULL)`, table, fn).Scan(&distributed, &delegated)
	switch {
	case err != nil:
		return fmt.Errorf("look up %s in Citus's metadata: %w", table, err)
	case !distributed:
		return nil
	case !delegated:
		return fmt.Errorf("%w: %s is a Citus distributed table without pglimit's functions; run pglimit.Distribute on schema %s", ErrUnsupported, table, l.cfg.Schema)
	}
	s := l.distributedStatements()
	l.dist.Store(&s)
	return nil
}
