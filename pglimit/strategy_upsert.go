package pglimit

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// upsertLimiter admits with one INSERT ... ON CONFLICT DO UPDATE whose WHERE
// clause passes only when the stored cooldown has ended. The row lock that
// ON CONFLICT takes serializes concurrent requests for one key, so two can
// never both see an ended cooldown.
type upsertLimiter struct {
	base
	allowSQL string
	resetSQL string
}

var _ Limiter = (*upsertLimiter)(nil)

// The second branch reads the current cooldown so that a refusal says when
// to come back within the same round trip. It sees the statement's snapshot:
// a row admitted concurrently may be invisible to it, which refused() turns
// into the whole cooldown.
const upsertAllowSQL = `
WITH admitted AS (
    INSERT INTO %[1]s AS t (namespace, key, expires_at)
    VALUES ($1, $2, statement_timestamp() + $3::interval)
    ON CONFLICT (namespace, key) DO UPDATE
        SET expires_at = EXCLUDED.expires_at
        WHERE t.expires_at <= statement_timestamp()
    RETURNING t.expires_at
)
SELECT true, expires_at, statement_timestamp() FROM admitted
UNION ALL
SELECT false, t.expires_at, statement_timestamp()
FROM %[1]s AS t
WHERE t.namespace = $1 AND t.key = $2 AND NOT EXISTS (SELECT FROM admitted)`

const deleteKeySQL = `DELETE FROM %s WHERE namespace = $1 AND key = $2`

func newUpsert(b base, table string) *upsertLimiter {
	return &upsertLimiter{
		base:     b,
		allowSQL: sqlf(upsertAllowSQL, table),
		resetSQL: sqlf(deleteKeySQL, table),
	}
}

func (l *upsertLimiter) Allow(ctx context.Context, key string) (Decision, error) {
	return l.decide(ctx, key, func(ctx context.Context) (Decision, error) {
		return l.allow(ctx, l.db, key)
	})
}

func (l *upsertLimiter) AllowTx(ctx context.Context, tx pgx.Tx, key string) (Decision, error) {
	return l.decide(ctx, key, func(ctx context.Context) (Decision, error) {
		return l.allow(ctx, tx, key)
	})
}

func (l *upsertLimiter) allow(ctx context.Context, db DB, key string) (Decision, error) {
	var (
		ok           bool
		expires, now time.Time
	)
	err := db.QueryRow(ctx, l.allowSQL, l.cfg.Namespace, key, l.cfg.Cooldown).Scan(&ok, &expires, &now)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Neither admitted nor visible: a concurrent first request for the
		// key inserted it after this statement's snapshot.
		return l.refused(time.Time{}, now), nil
	case err != nil:
		return Decision{}, err
	case ok:
		return admitted(expires, now), nil
	default:
		return l.refused(expires, now), nil
	}
}

func (l *upsertLimiter) Reset(ctx context.Context, key string) error {
	return l.reset(ctx, l.resetSQL, key)
}
