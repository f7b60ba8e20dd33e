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
// and hands its row to scan. When the server refuses a statement, the
// savepoint is rolled back and tx stays usable.
//
// On a pgx transaction, the savepoint, its settings, the statement and
// their undoing go to the server in one pipeline, one round trip, once the
// statement is prepared on tx's connection (or in a mode that prepares
// nothing). The first time, the savepoint goes first, then the statement
// is prepared, inside it: pgx would otherwise prepare it before the
// pipeline, and a prepare the server cancels there (lock_timeout or
// statement_timeout, while another session locks the table) would abort
// tx. Any other transaction (database/sql's, through pglimitsql) takes
// three round trips: the savepoint, the statement, then the restore and
// release.
func InSavepoint(ctx context.Context, tx DB, timeout time.Duration, sql string, args []any, scan func(pgx.Row) error) (err error) {
	ms := (timeout + time.Millisecond - 1) / time.Millisecond // round up: 0 would disable it
	bound := fmt.Sprintf("%dms", ms)
	bs, pipelines := tx.(batchSender)
	conn := pgxConn(tx)
	switch {
	case pipelines && ready(conn, sql):
		err = pipelined(ctx, bs, bound, sql, args, scan)
	default:
		// The setting is written into the text, which then has no
		// arguments, so that it and the savepoint go in one
		// simple-protocol message.
		set := strings.ReplaceAll(setLockTimeoutSQL, "$1", "'"+bound+"'")
		if _, err = tx.Exec(ctx, savepointSQL+"; "+set); err != nil {
			break
		}
		switch {
		case conn != nil && pipelines:
			if err = prepare(ctx, conn, sql); err == nil {
				err = pipelined(ctx, bs, "", sql, args, scan)
			}
		case pipelines:
			err = pipelined(ctx, bs, "", sql, args, scan)
		default:
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

// pgxConn is tx's pgx connection, or nil when tx is not a pgx transaction.
func pgxConn(tx DB) *pgx.Conn {
	if c, ok := tx.(interface{ Conn() *pgx.Conn }); ok {
		return c.Conn()
	}
	return nil
}

// preparedKey is where a connection's custom data records the statements
// InSavepoint prepared on it.
const preparedKey = "pglimit.prepared"

// ready reports whether pgx sends sql on conn without preparing or
// describing it first, in a round trip of its own: conn prepares nothing
// in its mode, or InSavepoint prepared sql on it.
func ready(conn *pgx.Conn, sql string) bool {
	if conn == nil {
		return false
	}
	switch conn.Config().DefaultQueryExecMode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
		return true
	}
	done, _ := conn.PgConn().CustomData()[preparedKey].(map[string]bool)
	return done[sql]
}

// prepare prepares sql on conn, named by its text, so that pgx's pipelines
// use it as it is, and records it for ready.
func prepare(ctx context.Context, conn *pgx.Conn, sql string) error {
	if _, err := conn.Prepare(ctx, sql, sql); err != nil {
		return err
	}
	data := conn.PgConn().CustomData()
	done, _ := data[preparedKey].(map[string]bool)
	if done == nil {
		done = map[string]bool{}
		data[preparedKey] = done
	}
	done[sql] = true
	return nil
}

// pipelined sends the savepoint and its settings to bound (unless bound
// is "": they were sent), the statement, the restore and the release in
// one pipeline.
func pipelined(ctx context.Context, bs batchSender, bound, sql string, args []any, scan func(pgx.Row) error) error {
	var scanErr error
	var b pgx.Batch
	if bound != "" {
		b.Queue(savepointSQL)
		b.Queue(setLockTimeoutSQL, bound)
	}
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
