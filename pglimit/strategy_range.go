package pglimit

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// rangeLimiter admits by inserting [now, now+cooldown) into a table whose
// exclusion constraint forbids two overlapping ranges for one key.
//
// ON CONFLICT DO NOTHING (allowed with an exclusion constraint, unlike DO
// UPDATE) turns an overlap into "no row" instead of an error, so racing
// inserts neither abort nor deadlock. With Config.PlainInsert the limiter
// instead catches exclusion_violation, as the original article did.
type rangeLimiter struct {
	base
	allowSQL  string
	insertSQL string
	lookupSQL string
	resetSQL  string
}

var _ Limiter = (*rangeLimiter)(nil)

const (
	// As for Upsert, the second branch reads when the blocking cooldown
	// ends, from the statement's snapshot.
	rangeAllowSQL = `
WITH admitted AS (
    INSERT INTO %[1]s (namespace, key, during)
    VALUES ($1, $2, tstzrange(statement_timestamp(), statement_timestamp() + $3::interval))
    ON CONFLICT DO NOTHING
    RETURNING upper(during) AS expires_at
)
SELECT true, expires_at, statement_timestamp() FROM admitted
UNION ALL
(SELECT false, upper(t.during), statement_timestamp()
 FROM %[1]s AS t
 WHERE t.namespace = $1 AND t.key = $2
   AND t.during && tstzrange(statement_timestamp(), NULL)
   AND NOT EXISTS (SELECT FROM admitted)
 ORDER BY upper(t.during) DESC
 LIMIT 1)`

	rangePlainInsertSQL = `
INSERT INTO %s (namespace, key, during)
VALUES ($1, $2, tstzrange(statement_timestamp(), statement_timestamp() + $3::interval))
RETURNING upper(during), statement_timestamp()`

	rangeLookupSQL = `
SELECT upper(during), statement_timestamp()
FROM %s
WHERE namespace = $1 AND key = $2 AND during && tstzrange(statement_timestamp(), NULL)
ORDER BY upper(during) DESC
LIMIT 1`
)

func newRange(b base, table string) *rangeLimiter {
	return &rangeLimiter{
		base:      b,
		allowSQL:  sqlf(rangeAllowSQL, table),
		insertSQL: sqlf(rangePlainInsertSQL, table),
		lookupSQL: sqlf(rangeLookupSQL, table),
		resetSQL:  sqlf(deleteKeySQL, table),
	}
}

func (l *rangeLimiter) Allow(ctx context.Context, key string) (Decision, error) {
	return l.decide(ctx, key, func(ctx context.Context) (Decision, error) {
		return l.allow(ctx, l.db, key, false)
	})
}

func (l *rangeLimiter) AllowTx(ctx context.Context, tx pgx.Tx, key string) (Decision, error) {
	return l.decide(ctx, key, func(ctx context.Context) (Decision, error) {
		return l.allow(ctx, tx, key, true)
	})
}

func (l *rangeLimiter) allow(ctx context.Context, db DB, key string, inTx bool) (Decision, error) {
	if l.cfg.PlainInsert {
		return l.allowPlain(ctx, db, key, inTx)
	}
	var (
		ok           bool
		expires, now time.Time
	)
	err := db.QueryRow(ctx, l.allowSQL, l.cfg.Namespace, key, l.cfg.Cooldown).Scan(&ok, &expires, &now)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return l.refused(time.Time{}, time.Time{}), nil
	case err != nil:
		return Decision{}, err
	case ok:
		return admitted(expires, now), nil
	default:
		return l.refused(expires, now), nil
	}
}

// allowPlain is the article's form: INSERT, and an exclusion violation
// means refused. Inside a caller's transaction it runs in a savepoint so the
// violation does not abort the caller's work.
func (l *rangeLimiter) allowPlain(ctx context.Context, db DB, key string, inTx bool) (Decision, error) {
	var expires, now time.Time
	insert := func(q DB) error {
		return q.QueryRow(ctx, l.insertSQL, l.cfg.Namespace, key, l.cfg.Cooldown).Scan(&expires, &now)
	}
	var err error
	if inTx {
		err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return insert(tx) })
	} else {
		err = insert(db)
	}
	if err == nil {
		return admitted(expires, now), nil
	}
	if pgCode(err) != codeExclusionViolation {
		return Decision{}, err
	}
	err = db.QueryRow(ctx, l.lookupSQL, l.cfg.Namespace, key).Scan(&expires, &now)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Decision{}, err
	}
	return l.refused(expires, now), nil
}

func (l *rangeLimiter) Reset(ctx context.Context, key string) error {
	return l.reset(ctx, l.resetSQL, key)
}
