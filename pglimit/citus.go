package pglimit

import (
	"cmp"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit/internal/engine"
	"github.com/pglimit/cooldown/pglimit/internal/lockid"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
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

// Function names are the table's name with a suffix (engine.AllowSuffix
// and the others); the signatures are what create_distributed_function
// and the detection look up.
const (
	rowAllowArgs   = "(text,text,bigint,integer,bigint,boolean,boolean,text)"
	rowDecideArgs  = "(text,text,integer,bigint,integer,bigint,bigint[],boolean,boolean,text)"
	rowPeekArgs    = "(text,text)"
	rangeAllowArgs = "(text,text,bigint,integer,boolean,text)"
	rangePeekArgs  = "(text,text)"
	decideArgs     = "(bigint[],bigint,bigint,bigint,integer,bigint,bigint[])"
)

// Distribute makes the limiter tables of schema Citus distributed tables,
// so that a decision takes one hop, to the node that holds its key.
//
// schema "" means "public". The tables, which [Migrate] created, are sharded
// by key, all in one colocation group, and Distribute installs the functions
// that decide on the node that holds a key (see docs/citus.md). Run it on
// the coordinator after Migrate, and again after every Migrate that applied
// a migration; it is idempotent, and serialized between instances. Limiters
// need no other change: each finds out on its first decision that its table
// is distributed. Without the citus extension it returns an error wrapping
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
	if err := conn.QueryRow(ctx, queries.Static("citus.installed_here")).Scan(&citus); err != nil {
		return fmt.Errorf("pglimit: distribute: %w", err)
	}
	if !citus {
		return engine.Check(engine.Distribute, engine.Shape{Deployment: engine.NoCitus})
	}
	err = pollLock(ctx, func() (got bool, err error) {
		err = conn.QueryRow(ctx, queries.Static("advisory.try_lock"), lockid.Distribute).Scan(&got)
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
	if _, err := conn.Exec(ctx, queries.Static("citus.distribute_decide"), decide+decideArgs); err != nil {
		return fmt.Errorf("distribute pglimit_decide (run Migrate first): %w", err)
	}
	first := pgx.Identifier{schema, distributedTables[0]}.Sanitize()
	for _, name := range distributedTables {
		table := pgx.Identifier{schema, name}.Sanitize()
		var exists, distributed bool
		err := conn.QueryRow(ctx, queries.Static("citus.table_state"), table).Scan(&exists, &distributed)
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
			if _, err := conn.Exec(ctx, queries.Static("citus.distribute_table"), table, colocate); err != nil {
				return fmt.Errorf("distribute %s: %w", table, err)
			}
		}
		fns, err := createFunctions(ctx, conn, schema, name)
		if err != nil {
			return err
		}
		for _, fn := range fns {
			// The key routes each call to its shard's node.
			if _, err := conn.Exec(ctx, queries.Static("citus.delegate"), fn, table); err != nil {
				return fmt.Errorf("distribute %s: %w", fn, err)
			}
		}
	}
	return nil
}

// createFunctions creates (or replaces) the functions of table name in
// schema, and returns their signatures. They need no Citus: on plain
// PostgreSQL the tests run the library's decisions through them, so that
// their arithmetic is checked against the model wherever the tests run.
func createFunctions(ctx context.Context, db DB, schema, name string) ([]string, error) {
	table := pgx.Identifier{schema, name}.Sanitize()
	decide := pgx.Identifier{schema, "pglimit_decide"}.Sanitize()
	var signatures []string
	for _, f := range tableFunctions(name) {
		fn := pgx.Identifier{schema, name + f.suffix}.Sanitize()
		if _, err := db.Exec(ctx, queries.Text(f.template, queries.Args{"table": table, "function": fn, "decide": decide})); err != nil {
			return nil, fmt.Errorf("create %s: %w", fn, err)
		}
		signatures = append(signatures, fn+f.args)
	}
	return signatures, nil
}

// tableFunction is a function Distribute installs: its name's suffix, its
// signature, and its template in internal/queries.
type tableFunction struct{ suffix, args, template string }

// tableFunctions lists the functions of a table: Range's, or those of a
// table of one row per key.
func tableFunctions(table string) []tableFunction {
	if table == rangeTable {
		return []tableFunction{
			{engine.AllowSuffix, rangeAllowArgs, "citus.range_allow"},
			{engine.PeekSuffix, rangePeekArgs, "citus.range_peek"},
		}
	}
	return []tableFunction{
		{engine.AllowSuffix, rowAllowArgs, "citus.row_allow"},
		{engine.DecideSuffix, rowDecideArgs, "citus.row_decide"},
		{engine.PeekSuffix, rowPeekArgs, "citus.row_peek"},
	}
}

// detectDistributed finds out whether the limiter's table is a Citus
// distributed table and, if so with pglimit's functions there, switches
// the limiter to them; it returns what it found, which check holds to the
// capability table. On plain PostgreSQL it costs one catalog lookup, once.
func (l *limiter) detectDistributed(ctx context.Context, db DB) (engine.Deployment, error) {
	var citus bool
	if err := db.QueryRow(ctx, queries.Static("citus.present")).Scan(&citus); err != nil {
		return 0, err // the limiter's first statement: a connection error, mostly
	}
	if !citus {
		return engine.OneServer, nil
	}
	table := pgx.Identifier{l.cfg.Schema, l.cfg.Table}.Sanitize()
	args := rowAllowArgs
	if l.plain.General == nil {
		args = rangeAllowArgs
	}
	fn := pgx.Identifier{l.cfg.Schema, l.cfg.Table + engine.AllowSuffix}.Sanitize() + args
	var distributed, delegated bool
	err := db.QueryRow(ctx, queries.Static("citus.distributed"), table, fn).Scan(&distributed, &delegated)
	switch {
	case err != nil:
		return 0, fmt.Errorf("look up %s in Citus's metadata: %w", table, err)
	case !distributed:
		return engine.OneServer, nil
	case !delegated:
		return engine.DistributedBare, nil
	}
	s := engine.Citus(specOf(l.cfg))
	l.dist.Store(&s)
	return engine.Distributed, nil
}
