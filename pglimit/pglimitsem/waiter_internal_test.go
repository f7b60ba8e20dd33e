package pglimitsem

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
)

// A waiter's id reaches the server as made, and notes that its statement
// was sent, in every mode pgx runs statements in (QueryExecModeExec and
// the simple protocol among them, which PgBouncer needs); one whose
// caller gave up before it got a connection notes nothing. Without the note, a
// join cut off is not taken out (TestWaitCancelledJoinLeaves).
func TestWaiterIDNotesSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		cfg, err := pgxpool.ParseConfig(testdb.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = mode
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		id := newWaiterID()
		var got string
		if err := pool.QueryRow(ctx, "SELECT $1::uuid::text", id).Scan(&got); err != nil || got != id.text() || !id.sent.Load() {
			t.Errorf("%v: the server got %q, %v; want %q; sent noted: %v", mode, got, err, id.text(), id.sent.Load())
		}
		gone, cancel := context.WithCancel(ctx)
		cancel()
		unsent := newWaiterID()
		if err := pool.QueryRow(gone, "SELECT $1::uuid::text", unsent).Scan(&got); err == nil || unsent.sent.Load() {
			t.Errorf("%v: given up before a connection: %v, sent noted: %v; want an error and no note", mode, err, unsent.sent.Load())
		}
		pool.Close()
	}
}
