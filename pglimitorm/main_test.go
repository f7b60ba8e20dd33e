package pglimitorm_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// errTooSoon is what the examples' export function returns when the limiter
// refuses: an error, so that the ORM rolls the transaction back.
var errTooSoon = errors.New("too soon")

// outcome names what became of an export.
func outcome(err error) string {
	switch {
	case err == nil:
		return "recorded"
	case errors.Is(err, errTooSoon):
		return "too soon"
	}
	return "failed, not counted"
}

// migrate applies pglimit's migrations to schema ("" for public), for an
// application that has only a *sql.DB: Migrate takes a *pgxpool.Pool, so
// it opens one from the same URL for the time the migrations take.
func migrate(ctx context.Context, databaseURL, schema string) error {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	return pglimit.Migrate(ctx, pool, schema)
}

// setUp migrates a fresh schema on the test server for one example, and
// returns the server's URL, the schema, and a function that drops it.
func setUp(ctx context.Context) (url, schema string, drop func()) {
	url, err := pglimittest.ServerURL()
	if err != nil {
		panic(err)
	}
	schema = fmt.Sprintf("orm_example_%d", time.Now().UnixNano())
	if err := migrate(ctx, url, schema); err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	return url, schema, func() {
		defer pool.Close()
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			panic(err)
		}
	}
}
