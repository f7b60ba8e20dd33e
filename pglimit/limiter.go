package pglimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// stmtLimiter is every strategy that decides in one statement returning
// (admitted, microseconds until the cooldown ends) — all of them but Range with
// PlainInsert. The strategies differ only in their SQL and in which error
// means "someone else is deciding" (see strategy_*.go).
type stmtLimiter struct {
	base
	allowSQL   string // on the limiter's own db; may carry the async-commit setting
	allowTxSQL string // in a caller's transaction, whose durability is the caller's
	resetSQL   string

	// contended is the SQLSTATE that means a concurrent decision holds the
	// key; it becomes a refusal. Empty when contention cannot raise errors.
	// Such an error aborts a transaction, so in a caller's transaction the
	// statement runs in a savepoint.
	contended string
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
		return l.run(ctx, l.db, l.allowSQL, key)
	})
}

func (l *stmtLimiter) AllowTx(ctx context.Context, tx pgx.Tx, key string) (Decision, error) {
	return l.decide(ctx, key, true, func(ctx context.Context) (Decision, error) {
		if l.contended == "" {
			return l.run(ctx, tx, l.allowTxSQL, key)
		}
		var d Decision
		err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			var err error
			d, err = l.run(ctx, sp, l.allowTxSQL, key)
			return err
		})
		return d, err
	})
}

// Each statement returns (admitted, microseconds until the cooldown ends),
// computed in SQL: two plain integers scan with less work than two
// timestamps.
func (l *stmtLimiter) run(ctx context.Context, db DB, query, key string) (Decision, error) {
	var r struct {
		ok          bool
		remainingUS int64
	}
	err := db.QueryRow(ctx, query, l.args.namespace, key, l.args.cooldown).Scan(&r.ok, &r.remainingUS, nil)
	remaining := time.Duration(r.remainingUS) * time.Microsecond
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Neither admitted nor visible: a concurrent first request for the
		// key inserted it after this statement's snapshot was taken.
		return l.refused(unknown), nil
	case err != nil && l.contended != "" && pgCode(err) == l.contended:
		return l.refused(unknown), nil
	case err != nil:
		return Decision{}, err
	case r.ok:
		return admitted(remaining), nil
	default:
		return l.refused(remaining), nil
	}
}

func (l *stmtLimiter) Reset(ctx context.Context, key string) error {
	return l.reset(ctx, l.resetSQL, key)
}
