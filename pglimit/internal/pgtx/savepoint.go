// Package pgtx runs the library's statements in a caller's transaction,
// and reads the server's errors, for any driver.
package pgtx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// DB is what the library sends statements through: a pool, a connection,
// or a transaction (pglimit.DB has the same methods).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// The statements around a decision in a caller's transaction
// (internal/queries, savepoint.*).
var (
	savepointSQL          = queries.Static("savepoint")
	setLockTimeoutSQL     = queries.Static("savepoint.set_lock_timeout")
	restoreLockTimeoutSQL = queries.Static("savepoint.restore_lock_timeout")
	releaseSQL            = queries.Static("savepoint.release")
	rollbackSQL           = queries.Static("savepoint.rollback")
)

// batchSender is a transaction that pipelines statements: a pgx.Tx.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// InSavepoint runs the statement sql in a savepoint of the caller's
// transaction tx, under a lock_timeout and statement_timeout of timeout,
// and hands its row to scan. The savepoint and the settings go first, in
// one simple-protocol message. On a pgx transaction the statement and its undoing then go to
// the server in one pipeline: two round trips in all. Any other
// transaction (database/sql's, through pglimitsql) takes three: the
// statement, then the restore and release. When the server refuses a
// statement, the savepoint is rolled back and tx stays usable.
func InSavepoint(ctx context.Context, tx DB, timeout time.Duration, sql string, args []any, scan func(pgx.Row) error) (err error) {
	ms := (timeout + time.Millisecond - 1) / time.Millisecond // round up: 0 would disable it
	// The setting is written into the text, which has no arguments, so
	// that it and the savepoint go in one simple-protocol message. Not in
	// the pipeline: pgx prepares a batch's new statements before it sends
	// any, and a prepare the server cancels there (lock_timeout or
	// statement_timeout, while another session locks the table) would
	// abort tx, outside any savepoint.
	set := strings.ReplaceAll(setLockTimeoutSQL, "$1", fmt.Sprintf("'%dms'", ms))
	if _, err = tx.Exec(ctx, savepointSQL+"; "+set); err == nil {
		if bs, ok := tx.(batchSender); ok {
			err = pipelined(ctx, bs, sql, args, scan)
		} else {
			err = steps(ctx, tx, sql, args, scan)
		}
	}
	if Code(err) != "" {
		// The server refused a statement: the savepoint is aborted, the
		// connection is fine. Anything else has lost the connection.
		if _, rerr := tx.Exec(ctx, rollbackSQL); rerr != nil {
			return errors.Join(err, fmt.Errorf("roll back to savepoint: %w", rerr))
		}
	}
	return err
}

// pipelined sends the statement, the restore and the release in one
// pipeline.
func pipelined(ctx context.Context, bs batchSender, sql string, args []any, scan func(pgx.Row) error) error {
	var scanErr error
	var b pgx.Batch
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		scanErr = scan(row)
		return scanErr
	})
	b.Queue(restoreLockTimeoutSQL)
	b.Queue(releaseSQL)
	err := bs.SendBatch(ctx, &b).Close() // runs scan
	if scanErr != nil {
		err = scanErr
	}
	return err
}

// steps runs the statement, then the restore and the release, which have
// no arguments and go in one simple-protocol message. They follow a
// statement that returned no row too, as they do in the pipeline.
func steps(ctx context.Context, tx DB, sql string, args []any, scan func(pgx.Row) error) error {
	err := scan(tx.QueryRow(ctx, sql, args...))
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	if _, uerr := tx.Exec(ctx, restoreLockTimeoutSQL+"; "+releaseSQL); uerr != nil {
		return uerr
	}
	return err
}
