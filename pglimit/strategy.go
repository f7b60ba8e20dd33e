package pglimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/fault"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// The strategies differ only in their statements (internal/engine writes
// them, from internal/queries) and in which error means "someone else is
// deciding"; every one is a limiter.

// Upsert reads the key's row and, if the request fits, writes it through
// INSERT ... ON CONFLICT DO UPDATE, which locks the row's latest version
// and checks the request again there; a key never seen is inserted by the
// same write (key_row.allow, in internal/queries, says how). This is the
// statement of a single GCRA limit, of which a cooldown is one; other
// limits use the general statement.
func newUpsert(l *limiter, table string) *limiter {
	return withStatements(l, table, "")
}

// NoWait decides as Upsert does, in the same statement, but waits for the
// row's lock at most noWaitPatience: long enough for a concurrent
// admission of the key to commit (its WAL flush included, under load), too
// short to queue behind a caller's transaction that holds the row
// (AllowTx). A lock not granted by then raises
// lock_not_available (55P03), and the request is refused.
//
// This strategy's first form ran SELECT, UPDATE or INSERT and COMMIT as
// separate round trips, and locked with FOR UPDATE NOWAIT, which
// refused most requests that fitted a busy key's limit: another admission
// of it held the row for a few hundred microseconds (docs/throughput.md).
// Here it is one statement (key_row.allow). The lock is taken only on a
// row that fits the request in the statement's snapshot (the write checks
// that again on the latest row version), so a refusal takes no lock and
// writes nothing. The bounded wait is lock_timeout, set for the
// statement's transaction by a condition evaluated before the lock
// (nowait.condition); in a caller's transaction (AllowTx) the caller's
// own lock_timeout is restored after the statement. It differs from Upsert
// only in that wait, here and in the general statement.

// noWaitPatience is how long NoWait waits for a row lock that another
// decision holds; the statement nowait.condition says the same to the
// server.
const noWaitPatience = 20 * time.Millisecond

func newNoWait(l *limiter, table string) *limiter {
	return withStatements(l, table, pgtx.CodeLockNotAvailable)
}

// Range inserts [now, now+cooldown) into a table whose exclusion
// constraint forbids two overlapping ranges for one key (range.allow).
func newRange(l *limiter, table string) Limiter {
	withStatements(l, table, "")
	l.verify = func(ctx context.Context, db DB) error { return verifyExclusion(ctx, db, table) }
	return l
}

// verifyExclusion fails with ErrNoExclusionConstraint when the Range
// table has no exclusion constraint, which is the limiter: without it
// every request is admitted (range.exclusion_exists). Without btree_gist
// in the database the error wraps ErrExtension too, which says how to
// install it.
func verifyExclusion(ctx context.Context, db DB, table string) error {
	var ok, extension bool
	if err := db.QueryRow(ctx, queries.Static("range.exclusion_exists"), table).Scan(&ok, &extension); err != nil {
		return fmt.Errorf("check the exclusion constraint of %s: %w", table, err)
	}
	switch {
	case ok:
		return nil
	case !extension:
		return fmt.Errorf("%w: %s: %w", ErrNoExclusionConstraint, table, ErrExtension)
	default:
		return fmt.Errorf("%w: %s", ErrNoExclusionConstraint, table)
	}
}

// shapes are the columns each strategy's statements use, as the
// migrations create them: name and type.
var shapes = map[Strategy][]string{
	Upsert: {"namespace text", "key text", "expires_at timestamp with time zone", "state bigint[]"},
	NoWait: {"namespace text", "key text", "expires_at timestamp with time zone", "state bigint[]"},
	Range:  {"namespace text", "key text", "during tstzrange"},
}

// checkTable fails with ErrInvalidConfig, naming the table, when
// Config.Schema and Config.Table name no table, or one that lacks a column
// the strategy's statements use (another strategy's table, say): New reads
// nothing, and without this every decision would fail with a bare
// SQLSTATE (42P01, 42703) that looks like an outage. It reads the catalog
// only, so that it aborts no caller's transaction.
func (l *limiter) checkTable(ctx context.Context, db DB) error {
	return checkTableOf(ctx, db, l.cfg, l.table, shapes[l.cfg.Strategy])
}

// checkTableOf is checkTable for table, of c, which must have the columns
// shape.
func checkTableOf(ctx context.Context, db DB, c Config, table string, shape []string) error {
	var (
		exists bool
		lines  string
	)
	if err := db.QueryRow(ctx, queries.Static("table.columns"), table).Scan(&exists, &lines); err != nil {
		return fmt.Errorf("look up table %s: %w", table, err)
	}
	columns := strings.Split(lines, "\n")
	if !exists {
		return fmt.Errorf("%w: table %s does not exist (Config.Schema %q, Config.Table %q): check both names, or apply the migrations to the schema (pglimit.Migrate)",
			ErrInvalidConfig, table, c.Schema, c.Table)
	}
	var missing []string
	for _, col := range shape {
		if !slices.Contains(columns, col) {
			missing = append(missing, col)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: table %s (Config.Table %q) lacks the columns strategy %s uses: %s (its columns: %s); the migrations create %s for %s",
			ErrInvalidConfig, table, c.Table, c.Strategy, strings.Join(missing, ", "), strings.Join(columns, ", "), defaultTables[c.Strategy], c.Strategy)
	}
	return nil
}

// statementErr is err, the failure of op's statement on table (of c, with
// the columns shape), as fault.Wrap words it, or as ErrInvalidConfig naming
// the table where the server says that a table or a column does not exist (42P01, 42703): a
// misspelt Schema or Table, or a schema not migrated, is not an outage.
// It reads the catalog only after a statement has failed, so it costs the
// calls that succeed nothing. In a caller's transaction, which the failure
// has aborted, the lookup fails too, and the server's words, which name
// the relation, say it instead.
func statementErr(ctx context.Context, db DB, c Config, table string, shape []string, op string, err error) error {
	if code := pgtx.Code(err); code != pgtx.CodeUndefinedTable && code != pgtx.CodeUndefinedColumn {
		return fault.Wrap(ctx, op, c.Timeout, err)
	}
	if cerr := checkTableOf(ctx, db, c, table, shape); errors.Is(cerr, ErrInvalidConfig) {
		return fmt.Errorf("%w (%s)", cerr, op)
	}
	return fmt.Errorf("%w: %s on table %s (Config.Schema %q, Config.Table %q): %w: check both names, or apply the migrations to the schema (pglimit.Migrate)",
		ErrInvalidConfig, op, table, c.Schema, c.Table, err)
}
