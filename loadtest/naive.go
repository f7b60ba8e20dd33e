package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
)

// naiveRange is the Range strategy as one first writes it: a plain INSERT
// into pglimit's Range table, where the exclusion violation (23P01) means
// refused. Racing plain INSERTs on one key can deadlock (40P01), and the
// deadlock victim may be the request that would have been admitted; the
// load test runs it to show that failure mode beside the library's Range,
// which inserts ON CONFLICT DO NOTHING. It decides a cooldown only.
type naiveRange struct {
	pool      *pgxpool.Pool
	policy    pglimit.Policy
	cooldown  time.Duration
	insertSQL string
	lookupSQL string
	resetSQL  string
}

var _ pglimit.Limiter = (*naiveRange)(nil)

// naiveTimeout bounds a decision as pglimit's default Config.Timeout does,
// so that both Range forms give up after the same time.
const naiveTimeout = 2 * time.Second

const (
	naiveInsertSQL = `
INSERT INTO %s (namespace, key, during)
VALUES ($1, $2, tstzrange(statement_timestamp(), statement_timestamp() + $3::bigint * interval '1 microsecond'))
RETURNING (extract(epoch FROM upper(during) - statement_timestamp()) * 1000000)::bigint`

	naiveLookupSQL = `
SELECT (extract(epoch FROM upper(during) - statement_timestamp()) * 1000000)::bigint
FROM %s
WHERE namespace = $1 AND key = $2 AND during && tstzrange(statement_timestamp(), NULL)
ORDER BY upper(during) DESC
LIMIT 1`

	naiveResetSQL = `DELETE FROM %s WHERE namespace = $1 AND key = $2`

	codeExclusionViolation = "23P01"
)

// newNaiveRange returns the naive Range on table, a Range table as
// pglimit's migrations create it.
func newNaiveRange(pool *pgxpool.Pool, table pgx.Identifier, namespace string, cooldown time.Duration) (pglimit.Limiter, error) {
	if err := pglimit.ValidateKey(namespace); err != nil {
		return nil, fmt.Errorf("naive range: namespace: %w", err)
	}
	if cooldown <= 0 {
		return nil, fmt.Errorf("naive range: cooldown must be positive, got %s", cooldown)
	}
	name := table.Sanitize()
	return &naiveRange{
		pool: pool,
		policy: pglimit.Policy{Namespace: namespace, Strategy: pglimit.Range, Limits: []pglimit.Limit{
			{Name: "cooldown", Rate: 1, Period: cooldown, Burst: 1},
		}},
		cooldown:  cooldown,
		insertSQL: fmt.Sprintf(naiveInsertSQL, name),
		lookupSQL: fmt.Sprintf(naiveLookupSQL, name),
		resetSQL:  fmt.Sprintf(naiveResetSQL, name),
	}, nil
}

func (l *naiveRange) Allow(ctx context.Context, key string) (pglimit.Decision, error) {
	return l.AllowN(ctx, key, 1)
}

func (l *naiveRange) AllowN(ctx context.Context, key string, n int) (pglimit.Decision, error) {
	if err := l.check(key, n); err != nil {
		return pglimit.Decision{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, naiveTimeout)
	defer cancel()
	ends, admitted, err := l.insert(ctx, l.pool, key)
	switch {
	case err != nil:
		return pglimit.Decision{}, err
	case admitted:
		return l.admitted(ends), nil
	}
	return l.refusal(ctx, l.pool, key)
}

func (l *naiveRange) AllowTx(ctx context.Context, tx pglimit.DB, key string) (pglimit.Decision, error) {
	return l.AllowTxN(ctx, tx, key, 1)
}

// AllowTxN runs the INSERT in a savepoint, so that a violation does not
// abort the caller's transaction, which must be a pgx.Tx.
func (l *naiveRange) AllowTxN(ctx context.Context, db pglimit.DB, key string, n int) (pglimit.Decision, error) {
	if err := l.check(key, n); err != nil {
		return pglimit.Decision{}, err
	}
	tx, ok := db.(pgx.Tx)
	if !ok {
		return pglimit.Decision{}, fmt.Errorf("%w: naive range: AllowTx in a %T, not a pgx.Tx", pglimit.ErrUnsupported, db)
	}
	ctx, cancel := context.WithTimeout(ctx, naiveTimeout)
	defer cancel()
	sp, err := tx.Begin(ctx)
	if err != nil {
		return pglimit.Decision{}, fmt.Errorf("naive range: %w", err)
	}
	ends, admitted, err := l.insert(ctx, sp, key)
	switch {
	case err != nil:
		return pglimit.Decision{}, errors.Join(err, sp.Rollback(ctx))
	case admitted:
		return l.admitted(ends), sp.Commit(ctx)
	}
	if err := sp.Rollback(ctx); err != nil {
		return pglimit.Decision{}, fmt.Errorf("naive range: %w", err)
	}
	return l.refusal(ctx, tx, key)
}

// AllowAtMost grants one unit at most: a cooldown has no more.
func (l *naiveRange) AllowAtMost(ctx context.Context, key string, n int) (pglimit.Decision, error) {
	if n <= 0 {
		return pglimit.Decision{}, fmt.Errorf("%w: n must be positive, got %d", pglimit.ErrInvalidCost, n)
	}
	return l.AllowN(ctx, key, 1)
}

func (l *naiveRange) Reserve(context.Context, string, int, time.Duration) (pglimit.Decision, error) {
	return pglimit.Decision{}, fmt.Errorf("%w: Reserve on the naive Range", pglimit.ErrUnsupported)
}

func (l *naiveRange) Refund(context.Context, pglimit.Decision, int) (bool, error) {
	return false, fmt.Errorf("%w: Refund on the naive Range", pglimit.ErrUnsupported)
}

func (l *naiveRange) Peek(ctx context.Context, key string, n int) (pglimit.Decision, error) {
	if err := l.check(key, n); err != nil {
		return pglimit.Decision{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, naiveTimeout)
	defer cancel()
	wait, err := l.lookup(ctx, l.pool, key)
	if err != nil {
		return pglimit.Decision{}, err
	}
	if wait <= 0 {
		return l.admitted(l.cooldown), nil
	}
	return l.refused(wait), nil
}

func (l *naiveRange) Reset(ctx context.Context, key string) error {
	if err := pglimit.ValidateKey(key); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, naiveTimeout)
	defer cancel()
	if _, err := l.pool.Exec(ctx, l.resetSQL, l.policy.Namespace, key); err != nil {
		return fmt.Errorf("naive range: reset: %w", err)
	}
	return nil
}

func (l *naiveRange) Policy() pglimit.Policy {
	p := l.policy
	p.Limits = append([]pglimit.Limit(nil), p.Limits...)
	return p
}

func (l *naiveRange) check(key string, n int) error {
	if err := pglimit.ValidateKey(key); err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("%w: a cooldown admits one unit at a time, got n = %d", pglimit.ErrInvalidCost, n)
	}
	return nil
}

// querier is the pool, a caller's transaction or a savepoint in it.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// insert inserts the key's cooldown and returns how long it lasts;
// admitted is false when it overlaps a live one.
func (l *naiveRange) insert(ctx context.Context, q querier, key string) (ends time.Duration, admitted bool, err error) {
	var us int64
	err = q.QueryRow(ctx, l.insertSQL, l.policy.Namespace, key, l.cooldown.Microseconds()).Scan(&us)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == codeExclusionViolation {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("naive range: %w", err)
	}
	return time.Duration(us) * time.Microsecond, true, nil
}

// refusal reads the wait of the live cooldown that refused the key. One
// that ended between the two statements leaves a refusal with no wait, as
// the naive Range has it.
func (l *naiveRange) refusal(ctx context.Context, q querier, key string) (pglimit.Decision, error) {
	wait, err := l.lookup(ctx, q, key)
	if err != nil {
		return pglimit.Decision{}, err
	}
	return l.refused(wait), nil
}

// lookup returns how long the key's live cooldown lasts, 0 if none.
func (l *naiveRange) lookup(ctx context.Context, q querier, key string) (time.Duration, error) {
	var us int64
	err := q.QueryRow(ctx, l.lookupSQL, l.policy.Namespace, key).Scan(&us)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("naive range: %w", err)
	}
	return max(time.Duration(us)*time.Microsecond, 0), nil
}

func (l *naiveRange) admitted(resetAfter time.Duration) pglimit.Decision {
	return pglimit.Decision{Allowed: true, Granted: 1, ResetAfter: resetAfter, Limit: l.policy.Limits[0]}
}

func (l *naiveRange) refused(wait time.Duration) pglimit.Decision {
	return pglimit.Decision{RetryAfter: wait, ResetAfter: wait, Limit: l.policy.Limits[0]}
}
