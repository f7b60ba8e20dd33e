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
// A live cooldown in the statement's snapshot is a refusal, read without
// a lock or a write. Otherwise the statement takes a transaction-level
// advisory lock on the key, so that it waits for a concurrent admission
// (in a caller's open transaction, say) before it reads the clock, and
// inserts its range from then. ON CONFLICT DO NOTHING (allowed with an
// exclusion constraint, unlike DO UPDATE) turns an overlap with an
// admission committed after the snapshot into no row instead of an error,
// so racing inserts neither abort nor deadlock; the caller then runs the
// statement again on a fresh snapshot.
const rangeAllowSQL = `
WITH current AS (
    SELECT upper(t.during) AS expires_at FROM %[1]s AS t
    WHERE t.namespace = $1 AND t.key = $2
      AND t.during && tstzrange(clock_timestamp(), NULL)
    ORDER BY upper(t.during) DESC
    LIMIT 1
), first AS (
    SELECT pg_advisory_xact_lock($4::integer, hashtext($2))
    WHERE NOT EXISTS (SELECT FROM current)
), stamp AS (
    SELECT clock_timestamp() AS now FROM first
), admitted AS (
    INSERT INTO %[1]s (namespace, key, during)
    SELECT $1, $2, tstzrange(now, now + $3::bigint * interval '1 microsecond') FROM stamp
    ON CONFLICT DO NOTHING
    RETURNING upper(during) AS expires_at
)
SELECT true, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint, %[2]s FROM admitted
UNION ALL
SELECT false, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint, NULL::text FROM current`

func newRange(b base, table string) Limiter {
	if b.cfg.PlainInsert {
		return newPlainRange(b, table)
	}
	l := newStmtLimiter(b, table, rangeAllowSQL, "")
	l.verify = func(ctx context.Context, db DB) error { return verifyExclusion(ctx, db, table) }
	return l
}

// Without its exclusion constraint the Range table admits every request:
// the constraint is the limiter. It can go missing behind the limiter's
// back, with the btree_gist extension it needs (DROP EXTENSION ... CASCADE).
const exclusionExistsSQL = `
SELECT EXISTS (SELECT FROM pg_constraint WHERE conrelid = to_regclass($1) AND contype = 'x')`

func verifyExclusion(ctx context.Context, db DB, table string) error {
	var ok bool
	if err := db.QueryRow(ctx, exclusionExistsSQL, table).Scan(&ok); err != nil {
		return fmt.Errorf("check the exclusion constraint of %s: %w", table, err)
	}
	if !ok {
		return fmt.Errorf("%w: %s", ErrNoExclusionConstraint, table)
	}
	return nil
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
