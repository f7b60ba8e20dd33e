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
// transaction tx, under a lock_timeout of timeout, and hands its row to
// scan. On a pgx transaction the savepoint, the setting, the statement
// and their undoing go to the server in one pipeline, so they cost no
// round trip. Any other transaction (database/sql's, through pglimitsql)
// takes three: the savepoint and setting, the statement, the restore and
// release. When the server refuses a statement, the savepoint is rolled
// back and tx stays usable.
func InSavepoint(ctx context.Context, tx DB, timeout time.Duration, sql string, args []any, scan func(pgx.Row) error) (err error) {
	ms := (timeout + time.Millisecond - 1) / time.Millisecond // round up: 0 would disable it
	lockTimeout := fmt.Sprintf("%dms", ms)
	if bs, ok := tx.(batchSender); ok {
		var scanErr error
		var b pgx.Batch
		b.Queue(savepointSQL)
		b.Queue(setLockTimeoutSQL, lockTimeout)
		b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
			scanErr = scan(row)
			return scanErr
		})
		b.Queue(restoreLockTimeoutSQL)
		b.Queue(releaseSQL)
		err = bs.SendBatch(ctx, &b).Close() // runs scan
		if scanErr != nil {
			err = scanErr
		}
	} else {
		err = inSavepointSteps(ctx, tx, lockTimeout, sql, args, scan)
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

// inSavepointSteps is InSavepoint in three round trips. The setting is
// written into the text of the first, which has no arguments, so that it
// and the savepoint go in one simple-protocol message.
func inSavepointSteps(ctx context.Context, tx DB, lockTimeout, sql string, args []any, scan func(pgx.Row) error) error {
	set := strings.Replace(setLockTimeoutSQL, "$1", "'"+lockTimeout+"'", 1)
	if _, err := tx.Exec(ctx, savepointSQL+"; "+set); err != nil {
		return err
	}
	if err := scan(tx.QueryRow(ctx, sql, args...)); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, restoreLockTimeoutSQL+"; "+releaseSQL)
	return err
}
