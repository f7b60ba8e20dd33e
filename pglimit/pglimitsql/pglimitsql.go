// Package pglimitsql brings pglimit to database/sql, and so to GORM, sqlx,
// ent, bun and sqlc's database/sql code.
//
// [DB] adapts a *sql.DB opened with pgx's driver (github.com/jackc/pgx/v5/stdlib,
// which GORM's PostgreSQL driver uses) for a limiter's own statements: they
// run on pgx connections taken from the *sql.DB's pool, so a limiter on it
// decides exactly as one on a pgxpool.
//
// [Tx] adapts a transaction for [pglimit.Limiter.AllowTx], with any
// PostgreSQL driver, lib/pq included: the units count only if the caller's
// transaction commits. A pgx.Tx takes one round trip for AllowTx (the
// savepoint, the statement and the release in one pipeline, once the
// statement is prepared on its connection); a database/sql transaction
// takes three.
//
// A limiter on a lib/pq *sql.DB is not supported: its statements send and
// receive arrays, which lib/pq passes only through its own pq.Array, and
// lib/pq is in maintenance mode and recommends pgx. Give such a limiter a
// *sql.DB opened with pgx's driver (or a pgxpool) on the same database; its
// transactions may still be lib/pq's.
package pglimitsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglimit/cooldown/pglimit"
)

// DB adapts db, opened with pgx's driver, to [pglimit.DB]. Each statement
// runs on a pgx connection held from db's pool for its duration. With
// another driver every statement fails with [pglimit.ErrUnsupported].
func DB(db *sql.DB) pglimit.DB { return sqlDB{db} }

type sqlDB struct{ db *sql.DB }

// Stats is the pool's, so that a limiter's group commit keeps the
// statements it runs at once within the pool's MaxOpenConns.
func (s sqlDB) Stats() sql.DBStats { return s.db.Stats() }

func (s sqlDB) Exec(ctx context.Context, query string, args ...any) (tag pgconn.CommandTag, err error) {
	err = s.raw(ctx, func(c *pgx.Conn) error {
		tag, err = c.Exec(ctx, query, args...)
		return err
	})
	return tag, err
}

func (s sqlDB) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return scanFunc(func(dest ...any) error {
		return s.raw(ctx, func(c *pgx.Conn) error {
			return c.QueryRow(ctx, query, args...).Scan(dest...)
		})
	})
}

// raw runs f on the pgx connection under one of db's connections.
func (s sqlDB) raw(ctx context.Context, f func(*pgx.Conn) error) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("%w: pglimitsql: a limiter's *sql.DB must use pgx's driver (github.com/jackc/pgx/v5/stdlib), not %T; "+
				"a transaction of any driver works through pglimitsql.Tx", pglimit.ErrUnsupported, dc)
		}
		return f(c.Conn())
	})
}

type scanFunc func(dest ...any) error

func (f scanFunc) Scan(dest ...any) error { return f(dest...) }

// Queryer is what [Tx] needs of a transaction. *sql.Tx, *sqlx.Tx, bun.Tx
// and a GORM transaction's Statement.ConnPool have these methods.
type Queryer interface {
	// ExecContext runs query with args, as database/sql's does.
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	// QueryRowContext runs query with args and returns its first row, as
	// database/sql's does.
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Tx adapts the caller's open transaction tx to [pglimit.DB], for
// [pglimit.Limiter.AllowTx]. It works with any PostgreSQL driver. Passing
// anything but a transaction makes AllowTx fail with the server's error
// (SAVEPOINT outside a transaction block) and decide nothing.
func Tx(tx Queryer) pglimit.DB { return sqlTx{tx} }

type sqlTx struct{ tx Queryer }

// Exec runs query. Its command tag carries the rows affected, not the
// command's name, which database/sql does not report.
func (t sqlTx) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := t.tx.ExecContext(ctx, query, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, nil // the statement ran; only its count is unknown
	}
	return pgconn.NewCommandTag("EXEC " + strconv.FormatInt(n, 10)), nil
}

func (t sqlTx) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	row := t.tx.QueryRowContext(ctx, query, args...)
	return scanFunc(func(dest ...any) error {
		err := row.Scan(sqlDest(dest)...)
		if errors.Is(err, sql.ErrNoRows) {
			return pgx.ErrNoRows
		}
		return err
	})
}

// sqlDest turns pgx scan destinations into database/sql ones: nil, which
// pgx reads as "skip this column", becomes a discard, and a bigint array,
// which database/sql drivers hand over as text, gets a parser.
func sqlDest(dest []any) []any {
	out := make([]any, len(dest))
	for i, d := range dest {
		switch d := d.(type) {
		case nil:
			out[i] = new(any)
		case *[]int64:
			out[i] = (*int64s)(d)
		default:
			out[i] = d
		}
	}
	return out
}

// int64s scans a bigint[] from its text form, {1,2,3}.
type int64s []int64

func (a *int64s) Scan(src any) error {
	var s string
	switch src := src.(type) {
	case nil:
		*a = nil
		return nil
	case string:
		s = src
	case []byte:
		s = string(src)
	default:
		return fmt.Errorf("pglimitsql: scan %T into []int64", src)
	}
	if !strings.HasPrefix(s, "{") || !strings.HasSuffix(s, "}") {
		return fmt.Errorf("pglimitsql: %q is not a one-dimensional array", s)
	}
	*a = (*a)[:0]
	inner := s[1 : len(s)-1]
	if inner == "" {
		return nil
	}
	for f := range strings.SplitSeq(inner, ",") {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return fmt.Errorf("pglimitsql: array element %q: %w", f, err)
		}
		*a = append(*a, v)
	}
	return nil
}
