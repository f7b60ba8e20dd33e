package pglimit

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// stmtLimiter is every strategy that decides in one statement returning
// (admitted, microseconds until the cooldown ends, setting) — all of them
// but Range with PlainInsert. The strategies differ only in their SQL and in
// which error means "someone else is deciding" (see strategy_*.go).
//
// A statement that returns no row has not decided: a concurrent decision
// changed the key after the statement's snapshot was taken, so the
// statement cannot tell whether it would be admitted. It is run again on a
// fresh snapshot.
type stmtLimiter struct {
	base
	allowSQL   string // on the limiter's own db; may carry the async-commit setting
	allowTxSQL string // in a caller's transaction, whose durability is the caller's
	resetSQL   string

	// contended is the SQLSTATE that means a concurrent decision holds the
	// key; it becomes a refusal. Empty when contention raises no error.
	contended string

	// verify, when not nil, checks once that the table can keep the
	// limiter's promise; until it has passed, every decision runs it.
	verify   func(ctx context.Context, db DB) error
	verified atomic.Bool
}

var _ Limiter = (*stmtLimiter)(nil)

// Each statement template has %[1]s for the table and %[2]s for the value
// of an extra column in its admitting branches, where asyncCommitColumn
// sets synchronous_commit for the statement's own implicit transaction. A
// set_config is evaluated only when a row is admitted, which is the only
// time the statement writes.
const (
	asyncCommitColumn = `set_config('synchronous_commit', 'off', true)`
	noSettingColumn   = `NULL::text`
)

// maxAttempts bounds how often a decision re-runs its statement: after a
// concurrent change to the key (no row) or a serialization failure (40001,
// under a session default of REPEATABLE READ or SERIALIZABLE). A fresh
// snapshot settles either at once unless the key keeps changing, and then
// the request is refused: contention is a refusal, not an error.
const maxAttempts = 3

// SQLSTATE codes the strategies read.
const (
	codeLockNotAvailable     = "55P03"
	codeExclusionViolation   = "23P01"
	codeSerializationFailure = "40001"
)

func newStmtLimiter(b base, table, template, contended string) *stmtLimiter {
	column := noSettingColumn
	if b.cfg.AsyncCommit {
		column = asyncCommitColumn
	}
	return &stmtLimiter{
		base:       b,
		allowSQL:   fmt.Sprintf(template, table, column),
		allowTxSQL: fmt.Sprintf(template, table, noSettingColumn),
		resetSQL:   fmt.Sprintf(deleteKeySQL, table),
		contended:  contended,
	}
}

func (l *stmtLimiter) Allow(ctx context.Context, key string) (Decision, error) {
	return l.decide(ctx, key, false, func(ctx context.Context) (Decision, error) {
		if err := l.check(ctx, l.db); err != nil {
			return Decision{}, err
		}
		for range maxAttempts {
			d, decided, err := l.run(ctx, l.db, l.allowSQL, key)
			switch code := pgCode(err); {
			case code == codeSerializationFailure:
				continue // the statement was its own transaction: run it afresh
			case code != "" && code == l.contended:
				return l.refused(unknown), nil
			case err != nil || decided:
				return d, err
			}
		}
		return l.refused(unknown), nil
	})
}

// AllowTx runs the statement in a savepoint, so that no error of its own
// (contention, a serialization failure at the caller's isolation level, a
// lock wait past Timeout) aborts the caller's transaction. The wait is
// bounded on the server by lock_timeout, set for the savepoint and restored
// after it: a client-side deadline would make pgx close the caller's
// connection.
func (l *stmtLimiter) AllowTx(ctx context.Context, tx pgx.Tx, key string) (Decision, error) {
	return l.decide(ctx, key, true, func(ctx context.Context) (Decision, error) {
		if err := l.check(ctx, tx); err != nil {
			return Decision{}, err
		}
		for range maxAttempts {
			d, decided, err := l.runInSavepoint(ctx, tx, key)
			switch code := pgCode(err); {
			case err == nil && !decided:
				continue // in READ COMMITTED the next statement has a fresh snapshot
			case code != "" && code == l.contended:
				return l.refused(unknown), nil
			case code == codeLockNotAvailable:
				return Decision{}, fmt.Errorf("%w (%s, lock_timeout %s): %w", ErrTimeout, l.cfg.Strategy, l.cfg.Timeout, err)
			case code == codeSerializationFailure:
				// At REPEATABLE READ or above, a concurrent decision changed
				// the key after the caller's snapshot: it won the race.
				return l.refused(unknown), nil
			default:
				return d, err
			}
		}
		return l.refused(unknown), nil
	})
}

// savepointSQL and its companions wrap the statement in AllowTx. They go to
// the server in one pipeline with it, so they cost no round trip. The
// caller's lock_timeout is kept in a placeholder setting and restored; a
// rollback to the savepoint restores it too.
const (
	savepointSQL      = `SAVEPOINT pglimit_decision`
	setLockTimeoutSQL = `SELECT set_config('pglimit.saved_lock_timeout', current_setting('lock_timeout'), true),
       set_config('lock_timeout', $1, true)`
	restoreLockTimeoutSQL = `SELECT set_config('lock_timeout', current_setting('pglimit.saved_lock_timeout'), true)`
	releaseSQL            = `RELEASE SAVEPOINT pglimit_decision`
	rollbackSQL           = `ROLLBACK TO SAVEPOINT pglimit_decision; RELEASE SAVEPOINT pglimit_decision`
)

func (l *stmtLimiter) runInSavepoint(ctx context.Context, tx pgx.Tx, key string) (d Decision, decided bool, err error) {
	ms := (l.cfg.Timeout + time.Millisecond - 1) / time.Millisecond // round up: 0 would disable it
	var b pgx.Batch
	b.Queue(savepointSQL)
	b.Queue(setLockTimeoutSQL, fmt.Sprintf("%dms", ms))
	q := b.Queue(l.allowTxSQL, l.args.namespace, key, l.args.cooldown, l.args.lockClass)
	b.Queue(restoreLockTimeoutSQL)
	b.Queue(releaseSQL)
	q.QueryRow(func(row pgx.Row) error {
		d, decided, err = l.scan(row)
		return err
	})
	if batchErr := tx.SendBatch(ctx, &b).Close(); err == nil {
		err = batchErr
	}
	if pgCode(err) != "" {
		// The server refused a statement: the savepoint is aborted, the
		// connection is fine. Anything else has lost the connection.
		if _, rerr := tx.Exec(ctx, rollbackSQL); rerr != nil {
			return Decision{}, false, errors.Join(err, fmt.Errorf("roll back to savepoint: %w", rerr))
		}
	}
	return d, decided, err
}

// check runs verify until it has passed once.
func (l *stmtLimiter) check(ctx context.Context, db DB) error {
	if l.verify == nil || l.verified.Load() {
		return nil
	}
	if err := l.verify(ctx, db); err != nil {
		return err
	}
	l.verified.Store(true)
	return nil
}

// run runs the statement once. decided is false when it returned no row.
func (l *stmtLimiter) run(ctx context.Context, db DB, query, key string) (d Decision, decided bool, err error) {
	return l.scan(db.QueryRow(ctx, query, l.args.namespace, key, l.args.cooldown, l.args.lockClass))
}

// scan reads the statement's answer: (admitted, microseconds until the
// cooldown ends, setting), computed in SQL, since two plain integers scan
// with less work than two timestamps.
func (l *stmtLimiter) scan(row pgx.Row) (d Decision, decided bool, err error) {
	var r struct {
		ok          bool
		remainingUS int64
	}
	err = row.Scan(&r.ok, &r.remainingUS, nil)
	remaining := time.Duration(r.remainingUS) * time.Microsecond
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Decision{}, false, nil
	case err != nil:
		return Decision{}, false, err
	case r.ok:
		return admitted(remaining), true, nil
	default:
		return l.refused(remaining), true, nil
	}
}

func (l *stmtLimiter) Reset(ctx context.Context, key string) error {
	return l.reset(ctx, l.resetSQL, key)
}
