// Package cleanup holds the SQL that deletes limiter rows whose limits
// ended long enough ago, one bounded batch at a time.
package cleanup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// ErrNotLimiterTable reports a table that is missing or lacks a column that
// ends its rows.
var ErrNotLimiterTable = errors.New("not a limiter table")

// Querier runs the statements; *pgx.Conn and *pgxpool.Pool satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Table is a limiter table and the expression that says when a row's
// row ends.
type Table struct {
	// Name is the schema-qualified, quoted name.
	Name string

	// End is "expires_at" (Upsert, NoWait) or "upper(during)" (Range).
	End string

	// Sweep reports a table with no index on expires_at, which keeps its
	// updates HOT: it is cleaned by ranges of blocks (DeleteBlocks), since
	// DeleteBatch would scan and sort the whole table at every batch.
	Sweep bool

	// Distributed reports a Citus distributed table, cleaned by key
	// (DeleteBatch picks expired keys, then deletes their expired rows):
	// Citus runs no FOR UPDATE over several shards, and has no ctid that
	// names a row across them.
	Distributed bool

	deleteSQL, sweepSQL, keysSQL, backlogSQL string
}

// Which column ends a row, by the type the migrations give it.
var ends = []struct{ column, end string }{
	{"expires_at timestamp with time zone", "expires_at"},
	{"during tstzrange", "upper(during)"},
}

// Describe looks up schema.name, which the caller has validated, and tells
// which column ends its rows.
func Describe(ctx context.Context, q Querier, schema, name string) (Table, error) {
	qualified := pgx.Identifier{schema, name}.Sanitize()
	var (
		exists, indexed bool
		columns         []string
	)
	if err := q.QueryRow(ctx, queries.Static("cleanup.describe"), qualified).Scan(&exists, &columns, &indexed); err != nil {
		return Table{}, fmt.Errorf("describe %s: %w", qualified, err)
	}
	if !exists {
		return Table{}, fmt.Errorf("%w: table %s does not exist; apply the migrations (pglimit.Migrate) first", ErrNotLimiterTable, qualified)
	}
	for _, e := range ends {
		for _, col := range columns {
			if col != e.column {
				continue
			}
			t := Table{
				Name: qualified, End: e.end, Sweep: e.end == "expires_at" && !indexed,
				deleteSQL:  queries.Text("cleanup.delete", queries.Args{"table": qualified, "end": e.end}),
				sweepSQL:   queries.Text("cleanup.sweep", queries.Args{"table": qualified, "end": e.end}),
				backlogSQL: queries.Text("cleanup.backlog", queries.Args{"table": qualified, "end": e.end}),
			}
			return t, t.describeDistribution(ctx, q)
		}
	}
	return Table{}, fmt.Errorf("%w: table %s has neither an expires_at timestamptz column nor a during tstzrange column", ErrNotLimiterTable, qualified)
}

// describeDistribution marks t distributed if Citus distributes it.
func (t *Table) describeDistribution(ctx context.Context, q Querier) error {
	var citus, coordinator bool
	if err := q.QueryRow(ctx, queries.Static("citus.present")).Scan(&citus); err != nil || !citus {
		return err
	}
	if err := q.QueryRow(ctx, queries.Static("cleanup.distributed"), t.Name).Scan(&t.Distributed, &coordinator); err != nil {
		return fmt.Errorf("describe %s: %w", t.Name, err)
	}
	if t.Distributed && !coordinator {
		return fmt.Errorf("%s is a Citus distributed table: clean it through the coordinator, where the leader's lock holds for the whole cluster", t.Name)
	}
	if t.Distributed {
		t.Sweep = false
		t.keysSQL = queries.Text("cleanup.keys", queries.Args{"table": t.Name, "end": t.End})
		t.deleteSQL = queries.Text("cleanup.keyed_delete", queries.Args{"table": t.Name, "end": t.End})
	}
	return nil
}

// Backlog is a table's size and what a cleaner run would delete of it.
type Backlog struct {
	Bytes, Rows int64 // its size on disk, indexes included, and its estimated rows
	Due         int64 // rows whose limits ended more than the retention ago
	Overdue     int64 // µs since the oldest of those became due; 0 if none
}

// Backlog measures t against retention. It reads the whole table.
func (t Table) Backlog(ctx context.Context, q Querier, retention time.Duration) (Backlog, error) {
	var b Backlog
	var overdue *int64
	err := q.QueryRow(ctx, t.backlogSQL, retention, t.Name).Scan(&b.Bytes, &b.Rows, &b.Due, &overdue)
	if overdue != nil {
		b.Overdue = *overdue
	}
	return b, err
}

// DeleteBatch deletes at most limit rows of t whose limits ended more
// than retention ago, and returns how many it deleted. Fewer than limit
// means none were left, or the rest were locked. On a distributed table it
// deletes the expired rows of at most limit keys (Range may hold several
// per key), and waits for a row that a request holds locked instead of
// skipping it.
func (t Table) DeleteBatch(ctx context.Context, q Querier, retention time.Duration, limit int) (int64, error) {
	if t.Distributed {
		return t.deleteKeys(ctx, q, retention, limit)
	}
	tag, err := q.Exec(ctx, t.deleteSQL, retention, limit)
	if err != nil {
		return 0, fmt.Errorf("delete from %s: %w", t.Name, err)
	}
	return tag.RowsAffected(), nil
}

func (t Table) deleteKeys(ctx context.Context, q Querier, retention time.Duration, limit int) (int64, error) {
	var keys []string
	if err := q.QueryRow(ctx, t.keysSQL, retention, limit).Scan(&keys); err != nil {
		return 0, fmt.Errorf("pick keys of %s: %w", t.Name, err)
	}
	if len(keys) == 0 {
		return 0, nil
	}
	tag, err := q.Exec(ctx, t.deleteSQL, retention, keys)
	if err != nil {
		return 0, fmt.Errorf("delete from %s: %w", t.Name, err)
	}
	return tag.RowsAffected(), nil
}

// DeleteBlocks deletes at most limit rows stored in blocks [from, to) of t
// whose limits ended more than retention ago. It returns how many it
// deleted, and the table's size in blocks.
func (t Table) DeleteBlocks(ctx context.Context, q Querier, retention time.Duration, from, to int64, limit int) (deleted, blocks int64, err error) {
	if err := q.QueryRow(ctx, t.sweepSQL, retention, from, to, limit, t.Name).Scan(&deleted, &blocks); err != nil {
		return 0, 0, fmt.Errorf("delete from %s: %w", t.Name, err)
	}
	return deleted, blocks, nil
}
