package pglimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Range inserts [now, now+cooldown) into a table whose exclusion constraint
// forbids two overlapping ranges for one key.
//
// ON CONFLICT DO NOTHING (allowed with an exclusion constraint, unlike DO
// UPDATE) turns an overlap into "no row" instead of an error, so racing
// inserts neither abort nor deadlock, and a refusal writes nothing. As for
// Upsert, the second branch reads when the blocking cooldown ends, from the
// statement's snapshot.
const rangeAllowSQL = `
WITH admitted AS (
    INSERT INTO %[1]s (namespace, key, during)
    VALUES ($1, $2, tstzrange(statement_timestamp(), statement_timestamp() + $3::bigint * interval '1 microsecond'))
    ON CONFLICT DO NOTHING
    RETURNING upper(during) AS expires_at
)
SELECT true, (extract(epoch FROM expires_at - statement_timestamp()) * 1000000)::bigint, %[2]s FROM admitted
UNION ALL
(SELECT false, (extract(epoch FROM upper(t.during) - statement_timestamp()) * 1000000)::bigint, NULL::text
 FROM %[1]s AS t
 WHERE t.namespace = $1 AND t.key = $2
   AND t.during && tstzrange(statement_timestamp(), NULL)
   AND NOT EXISTS (SELECT FROM admitted)
 ORDER BY upper(t.during) DESC
 LIMIT 1)`

func newRange(b base, table string) Limiter {
	if b.cfg.PlainInsert {
		return newPlainRange(b, table)
	}
	return newStmtLimiter(b, table, rangeAllowSQL, "")
}

// plainRangeLimiter is the article's form of Range: a plain INSERT, where an
// exclusion violation means refused. Racing plain INSERTs on one key can
// deadlock (40P01); it exists so the load test can show that.
type plainRangeLimiter struct {
	base
	insertSQL string
	lookupSQL string
	resetSQL  string
}

var _ Limiter = (*plainRangeLimiter)(nil)

const (
	rangePlainInsertSQL = `
INSERT INTO %s (namespace, key, during)
VALUES ($1, $2, tstzrange(statement_timestamp(), statement_timestamp() + $3::bigint * interval '1 microsecond'))
RETURNING upper(during), statement_timestamp()`

	rangeLookupSQL = `
SELECT upper(during), statement_timestamp()
FROM %s
WHERE namespace = $1 AND key = $2 AND during && tstzrange(statement_timestamp(), NULL)
ORDER BY upper(during) DESC
LIMIT 1`
)

func newPlainRange(b base, table string) *plainRangeLimiter {
	return &plainRangeLimiter{
		base:      b,
		insertSQL: fmt.Sprintf(rangePlainInsertSQL, table),
		lookupSQL: fmt.Sprintf(rangeLookupSQL, table),
		resetSQL:  fmt.Sprintf(deleteKeySQL, table),
	}
}

func (l *plainRangeLimiter) Allow(ctx context.Context, key string) (Decision, error) {
	return l.decide(ctx, key, false, func(ctx context.Context) (Decision, error) {
		return l.allow(ctx, l.db, key, false)
	})
}

func (l *plainRangeLimiter) AllowTx(ctx context.Context, tx pgx.Tx, key string) (Decision, error) {
	return l.decide(ctx, key, true, func(ctx context.Context) (Decision, error) {
		return l.allow(ctx, tx, key, true)
	})
}

// allow runs the INSERT; inside a caller's transaction it runs in a
// savepoint so that the violation does not abort the caller's work.
func (l *plainRangeLimiter) allow(ctx context.Context, db DB, key string, inTx bool) (Decision, error) {
	var expires, now time.Time
	insert := func(q DB) error {
		return q.QueryRow(ctx, l.insertSQL, l.args.namespace, key, l.args.cooldown).Scan(&expires, &now)
	}
	var err error
	if inTx {
		err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return insert(tx) })
	} else {
		err = insert(db)
	}
	if err == nil {
		return admitted(expires.Sub(now)), nil
	}
	if pgCode(err) != codeExclusionViolation {
		return Decision{}, err
	}
	err = db.QueryRow(ctx, l.lookupSQL, l.args.namespace, key).Scan(&expires, &now)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return l.refused(unknown), nil
	case err != nil:
		return Decision{}, err
	}
	return l.refused(expires.Sub(now)), nil
}

func (l *plainRangeLimiter) Reset(ctx context.Context, key string) error {
	return l.reset(ctx, l.resetSQL, key)
}
