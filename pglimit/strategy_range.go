package pglimit

import (
	"context"
	"errors"
	"fmt"

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
WITH clock AS (
    SELECT clock_timestamp() AS now
), current AS (
    SELECT upper(t.during) AS expires_at, c.now FROM clock AS c, %[1]s AS t
    WHERE t.namespace = $1 AND t.key = $2
      AND t.during && tstzrange(c.now, NULL)
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
SELECT true, (extract(epoch FROM a.expires_at) * 1000000)::bigint, (extract(epoch FROM s.now) * 1000000)::bigint, %[2]s
FROM admitted AS a, stamp AS s
UNION ALL
SELECT false, (extract(epoch FROM expires_at) * 1000000)::bigint, (extract(epoch FROM now) * 1000000)::bigint, NULL::text
FROM current`

// rangePeekSQL reads the key's live cooldown, if any, and the clock.
const rangePeekSQL = `
SELECT (SELECT (extract(epoch FROM max(upper(t.during))) * 1000000)::bigint FROM %[1]s AS t
        WHERE t.namespace = $1 AND t.key = $2 AND t.during && tstzrange(c.now, NULL)),
       (extract(epoch FROM c.now) * 1000000)::bigint
FROM (SELECT clock_timestamp() AS now) AS c`

func newRange(b base, table string) Limiter {
	if b.cfg.PlainInsert {
		return newPlainRange(b, table)
	}
	l := newStmtLimiter(b, table, rangeAllowSQL, "", "")
	l.peekSQL = fmt.Sprintf(rangePeekSQL, table)
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
// deadlock (40P01); it exists so the load test can show that. Everything but
// the decision itself is Range's.
type plainRangeLimiter struct {
	*stmtLimiter
	insertSQL string
	lookupSQL string
}

var _ Limiter = (*plainRangeLimiter)(nil)

const (
	rangePlainInsertSQL = `
INSERT INTO %s (namespace, key, during)
VALUES ($1, $2, tstzrange(statement_timestamp(), statement_timestamp() + $3::bigint * interval '1 microsecond'))
RETURNING (extract(epoch FROM upper(during)) * 1000000)::bigint, (extract(epoch FROM statement_timestamp()) * 1000000)::bigint`

	rangeLookupSQL = `
SELECT (extract(epoch FROM upper(during)) * 1000000)::bigint, (extract(epoch FROM statement_timestamp()) * 1000000)::bigint
FROM %s
WHERE namespace = $1 AND key = $2 AND during && tstzrange(statement_timestamp(), NULL)
ORDER BY upper(during) DESC
LIMIT 1`
)

func newPlainRange(b base, table string) *plainRangeLimiter {
	return &plainRangeLimiter{
		stmtLimiter: newStmtLimiter(b, table, rangeAllowSQL, "", ""),
		insertSQL:   fmt.Sprintf(rangePlainInsertSQL, table),
		lookupSQL:   fmt.Sprintf(rangeLookupSQL, table),
	}
}

func (l *plainRangeLimiter) Allow(ctx context.Context, key string) (Decision, error) {
	return l.AllowN(ctx, key, 1)
}

func (l *plainRangeLimiter) AllowN(ctx context.Context, key string, n int) (Decision, error) {
	if err := l.checkCost(n); err != nil {
		return Decision{}, err
	}
	return l.decide(ctx, key, false, true, func(ctx context.Context) (Decision, error) {
		return l.allow(ctx, l.db, key, false)
	})
}

func (l *plainRangeLimiter) AllowTx(ctx context.Context, tx pgx.Tx, key string) (Decision, error) {
	return l.AllowTxN(ctx, tx, key, 1)
}

func (l *plainRangeLimiter) AllowTxN(ctx context.Context, tx pgx.Tx, key string, n int) (Decision, error) {
	if err := l.checkCost(n); err != nil {
		return Decision{}, err
	}
	return l.decide(ctx, key, true, false, func(ctx context.Context) (Decision, error) {
		return l.allow(ctx, tx, key, true)
	})
}

// allow runs the INSERT; inside a caller's transaction it runs in a
// savepoint so that the violation does not abort the caller's work.
func (l *plainRangeLimiter) allow(ctx context.Context, db DB, key string, inTx bool) (Decision, error) {
	var tat, now int64
	insert := func(q DB) error {
		return q.QueryRow(ctx, l.insertSQL, l.args.namespace, key, l.emission).Scan(&tat, &now)
	}
	var err error
	if inTx {
		err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return insert(tx) })
	} else {
		err = insert(db)
	}
	if err == nil {
		return l.gcraDecision(true, tat, now, 1), nil
	}
	if pgCode(err) != codeExclusionViolation {
		return Decision{}, err
	}
	err = db.QueryRow(ctx, l.lookupSQL, l.args.namespace, key).Scan(&tat, &now)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return l.lostRace(), nil
	case err != nil:
		return Decision{}, err
	}
	return l.gcraDecision(false, tat, now, 1), nil
}
