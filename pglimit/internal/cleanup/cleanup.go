// Package cleanup holds the SQL that deletes limiter rows whose cooldown
// ended long enough ago, one bounded batch at a time.
package cleanup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotLimiterTable reports a table that is missing or lacks a column that
// ends cooldowns.
var ErrNotLimiterTable = errors.New("not a limiter table")

// Querier runs the statements; *pgx.Conn and *pgxpool.Pool satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Table is a limiter table and the expression that says when a row's
// cooldown ends.
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

	deleteSQL, sweepSQL, keysSQL string
}

// Which column ends a cooldown, by the type the migrations give it.
var ends = []struct{ column, end string }{
	{"expires_at timestamp with time zone", "expires_at"},
	{"during tstzrange", "upper(during)"},
}

// The inner SELECT picks at most $2 rows from the oldest end of the index,
// skipping rows a request holds locked; its FOR UPDATE re-checks the
// condition on a row updated since the statement's snapshot, so a key
// readmitted meanwhile is not picked. The outer condition repeats the test
// on the row the DELETE sees. A row is deleted only if its cooldown ended
// more than $1 ago by the database clock, and a Range row whose upper bound
// is infinite never is.
const deleteSQL = `
DELETE FROM %[1]s
WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM %[1]s
        WHERE %[2]s < now() - $1::interval
        ORDER BY %[2]s
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
  AND %[2]s < now() - $1::interval`

// sweepSQL deletes, among the rows stored in blocks [$2, $3), at most $4
// whose cooldown ended more than $1 ago, and returns how many, with the
// table's size in blocks ($5 is its name). The block range makes it a TID
// range scan (PostgreSQL 14+): each batch reads at most $3 - $2 blocks.
const sweepSQL = `
WITH deleted AS (
    DELETE FROM %[1]s
    WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM %[1]s
            WHERE ctid >= format('(%%s,0)', $2::bigint)::tid AND ctid < format('(%%s,0)', $3::bigint)::tid
              AND %[2]s < now() - $1::interval
            LIMIT $4
            FOR UPDATE SKIP LOCKED))
      AND %[2]s < now() - $1::interval
    RETURNING 1
)
SELECT (SELECT count(*) FROM deleted), pg_relation_size($5::regclass) / current_setting('block_size')::bigint`

const describeSQL = `
SELECT c.oid IS NOT NULL,
       coalesce((SELECT array_agg(a.attname::text || ' ' || format_type(a.atttypid, a.atttypmod))
                 FROM pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                   AND a.attname IN ('expires_at', 'during')), '{}'),
       EXISTS (SELECT FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
               WHERE i.indrelid = c.oid AND i.indisvalid AND a.attname = 'expires_at')
FROM (SELECT to_regclass($1) AS oid) c`

// keysSQL picks the keys of at most $2 rows whose cooldown ended more than
// $1 ago, oldest first; keyedDeleteSQL deletes the expired rows of those
// keys ($2), and re-checks the condition on the row version it deletes, so
// a key admitted again since it was picked is not deleted. Both run on
// every shard; now() is the coordinator's, one value for all of them.
const (
	keysSQL = `
SELECT coalesce(array_agg(DISTINCT k.key), '{}')
FROM (SELECT key FROM %[1]s WHERE %[2]s < now() - $1::interval ORDER BY %[2]s LIMIT $2) AS k`

	keyedDeleteSQL = `
DELETE FROM %[1]s
WHERE key = ANY ($2::text[])
  AND %[2]s < now() - $1::interval`
)

// distributedSQL tells whether a table is a Citus distributed table, and
// whether this session is on the coordinator, where the cleaners' leader
// lock must be taken: an advisory lock is one node's.
const distributedSQL = `
SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass($1)),
       citus_is_coordinator()`

// Describe looks up schema.name, which the caller has validated, and tells
// which column ends its cooldowns.
func Describe(ctx context.Context, q Querier, schema, name string) (Table, error) {
	qualified := pgx.Identifier{schema, name}.Sanitize()
	var (
		exists, indexed bool
		columns         []string
	)
	if err := q.QueryRow(ctx, describeSQL, qualified).Scan(&exists, &columns, &indexed); err != nil {
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
				deleteSQL: fmt.Sprintf(deleteSQL, qualified, e.end),
				sweepSQL:  fmt.Sprintf(sweepSQL, qualified, e.end),
			}
			return t, t.describeDistribution(ctx, q)
		}
	}
	return Table{}, fmt.Errorf("%w: table %s has neither an expires_at timestamptz column nor a during tstzrange column", ErrNotLimiterTable, qualified)
}

// describeDistribution marks t distributed if Citus distributes it.
func (t *Table) describeDistribution(ctx context.Context, q Querier) error {
	var citus, coordinator bool
	if err := q.QueryRow(ctx, "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL").Scan(&citus); err != nil || !citus {
		return err
	}
	if err := q.QueryRow(ctx, distributedSQL, t.Name).Scan(&t.Distributed, &coordinator); err != nil {
		return fmt.Errorf("describe %s: %w", t.Name, err)
	}
	if t.Distributed && !coordinator {
		return fmt.Errorf("%s is a Citus distributed table: clean it through the coordinator, where the leader's lock holds for the whole cluster", t.Name)
	}
	if t.Distributed {
		t.Sweep = false
		t.keysSQL = fmt.Sprintf(keysSQL, t.Name, t.End)
		t.deleteSQL = fmt.Sprintf(keyedDeleteSQL, t.Name, t.End)
	}
	return nil
}

// DeleteBatch deletes at most limit rows of t whose cooldown ended more
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
// whose cooldown ended more than retention ago. It returns how many it
// deleted, and the table's size in blocks.
func (t Table) DeleteBlocks(ctx context.Context, q Querier, retention time.Duration, from, to int64, limit int) (deleted, blocks int64, err error) {
	if err := q.QueryRow(ctx, t.sweepSQL, retention, from, to, limit, t.Name).Scan(&deleted, &blocks); err != nil {
		return 0, 0, fmt.Errorf("delete from %s: %w", t.Name, err)
	}
	return deleted, blocks, nil
}
