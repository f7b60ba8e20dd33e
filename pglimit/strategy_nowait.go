package pglimit

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// noWaitLimiter decides in a transaction (a savepoint inside the caller's):
// lock the key's row with NOWAIT, then update or insert it. A row locked by
// someone else means a concurrent request is deciding right now, so this one
// is refused without waiting.
type noWaitLimiter struct {
	base
	lockSQL   string
	updateSQL string
	insertSQL string
	resetSQL  string
}

var _ Limiter = (*noWaitLimiter)(nil)

const (
	noWaitLockSQL = `
SELECT expires_at, statement_timestamp()
FROM %s
WHERE namespace = $1 AND key = $2
FOR UPDATE NOWAIT`

	noWaitUpdateSQL = `
UPDATE %s
SET expires_at = statement_timestamp() + $3::interval
WHERE namespace = $1 AND key = $2
RETURNING expires_at, statement_timestamp()`

	// A conflict means a concurrent first request for the key won.
	noWaitInsertSQL = `
INSERT INTO %s (namespace, key, expires_at)
VALUES ($1, $2, statement_timestamp() + $3::interval)
ON CONFLICT (namespace, key) DO NOTHING
RETURNING expires_at, statement_timestamp()`
)

func newNoWait(b base, table string) *noWaitLimiter {
	return &noWaitLimiter{
		base:      b,
		lockSQL:   sqlf(noWaitLockSQL, table),
		updateSQL: sqlf(noWaitUpdateSQL, table),
		insertSQL: sqlf(noWaitInsertSQL, table),
		resetSQL:  sqlf(deleteKeySQL, table),
	}
}

func (l *noWaitLimiter) Allow(ctx context.Context, key string) (Decision, error) {
	return l.decide(ctx, key, func(ctx context.Context) (Decision, error) {
		return l.allow(ctx, l.db, key)
	})
}

func (l *noWaitLimiter) AllowTx(ctx context.Context, tx pgx.Tx, key string) (Decision, error) {
	return l.decide(ctx, key, func(ctx context.Context) (Decision, error) {
		return l.allow(ctx, tx, key)
	})
}

// allow runs the decision in a transaction begun on db: a real one on a
// pool, a savepoint on a caller's transaction, so that a lock_not_available
// error never aborts the caller's work.
func (l *noWaitLimiter) allow(ctx context.Context, db DB, key string) (Decision, error) {
	var d Decision
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		d, err = l.decideLocked(ctx, tx, key)
		return err
	})
	if pgCode(err) == codeLockNotAvailable {
		return l.refused(time.Time{}, time.Time{}), nil
	}
	return d, err
}

func (l *noWaitLimiter) decideLocked(ctx context.Context, tx pgx.Tx, key string) (Decision, error) {
	var expires, now time.Time
	err := tx.QueryRow(ctx, l.lockSQL, l.cfg.Namespace, key).Scan(&expires, &now)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		err = tx.QueryRow(ctx, l.insertSQL, l.cfg.Namespace, key, l.cfg.Cooldown).Scan(&expires, &now)
		if errors.Is(err, pgx.ErrNoRows) {
			return l.refused(time.Time{}, time.Time{}), nil
		}
	case err != nil:
		return Decision{}, err
	case expires.After(now):
		return l.refused(expires, now), nil
	default:
		err = tx.QueryRow(ctx, l.updateSQL, l.cfg.Namespace, key, l.cfg.Cooldown).Scan(&expires, &now)
	}
	if err != nil {
		return Decision{}, err
	}
	return admitted(expires, now), nil
}

func (l *noWaitLimiter) Reset(ctx context.Context, key string) error {
	return l.reset(ctx, l.resetSQL, key)
}
