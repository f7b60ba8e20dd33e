package pglimittest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
)

// Clock is a database clock that a test sets and moves, so that a test of
// "the 6th export today is refused, and tomorrow it passes" takes
// milliseconds instead of a day. pglimit decides on the database's clock,
// which a fake clock in Go cannot reach; a limiter made on [Clock.Pool]'s
// pools decides at the Clock's time instead.
//
// The clock stands still until the test moves it: every statement reads
// the same instant, the one [Clock.Now] returns. Decisions, Peek, Refund,
// Reset, Inspect, calendar windows and the semaphore's slots all follow
// it. What a limiter times in the process does not: Config.Timeout, the
// pre-block (Config.PreBlockSize) and the local fallback, and the leases
// of a busy key (a limit of 1,000 a second or more), which use Go's clock.
//
// It works by name resolution, not by changing pglimit: the pool's
// search_path puts a schema of the Clock's before pg_catalog, and that
// schema's clock_timestamp() and now() return the Clock's time. Every
// statement's text is the same as in production, and a pool that is not
// the Clock's reads the real time.
type Clock struct {
	tb     testing.TB
	admin  *pgxpool.Pool
	schema string
}

// NewClock creates a Clock at the server's current time (to the
// microsecond), dropped when the test ends.
func NewClock(tb testing.TB) *Clock {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	c := &Clock{tb: tb, admin: testdb.Pool(tb), schema: "pglimit_clock_" + hex.EncodeToString(b[:])}
	s := pgx.Identifier{c.schema}.Sanitize()
	// now() and clock_timestamp() both read the table: no statement sees
	// two times, as a frozen clock should. VOLATILE, as clock_timestamp()
	// is, so that no plan keeps a value.
	ddl := fmt.Sprintf(`
CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.clock (one boolean PRIMARY KEY DEFAULT true CHECK (one), at timestamptz NOT NULL);
INSERT INTO %[1]s.clock (at) VALUES (date_trunc('microseconds', pg_catalog.clock_timestamp()));
CREATE FUNCTION %[1]s.clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE AS 'SELECT at FROM %[1]s.clock';
CREATE FUNCTION %[1]s.now() RETURNS timestamptz LANGUAGE sql VOLATILE AS 'SELECT at FROM %[1]s.clock';`, s)
	ctx := context.Background()
	if _, err := c.admin.Exec(ctx, ddl); err != nil {
		tb.Fatalf("pglimittest: NewClock: %v", err)
	}
	tb.Cleanup(func() {
		if _, err := c.admin.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+s+" CASCADE"); err != nil {
			tb.Errorf("pglimittest: drop the clock's schema: %v", err)
		}
	})
	return c
}

// Pool returns a new pool to the shared server on which every statement
// reads the Clock's time, closed when the test ends. Make a limiter on it
// as on [Pool]'s; two pools of one Clock are two instances of an
// application that agree on the time.
func (c *Clock) Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.URL(tb))
	if err != nil {
		tb.Fatalf("pglimittest: %v", err)
	}
	cfg.MaxConns = 4
	// pg_catalog named after the Clock's schema is searched after it.
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{c.schema}.Sanitize() + ", pg_catalog"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pglimittest: %v", err)
	}
	tb.Cleanup(pool.Close)
	testdb.Warm(tb, pool)
	return pool
}

// Now returns the Clock's time.
func (c *Clock) Now() time.Time {
	c.tb.Helper()
	var at time.Time
	if err := c.admin.QueryRow(context.Background(), "SELECT at FROM "+pgx.Identifier{c.schema, "clock"}.Sanitize()).Scan(&at); err != nil {
		c.tb.Fatalf("pglimittest: Clock.Now: %v", err)
	}
	return at
}

// Set sets the Clock to t, to the microsecond. It may go back, which no
// real clock does: decisions then see the keys' state in their future.
func (c *Clock) Set(t time.Time) {
	c.tb.Helper()
	c.update("$1::timestamptz", t)
}

// Advance moves the Clock d ahead (back, if d is negative), to the
// microsecond.
func (c *Clock) Advance(d time.Duration) {
	c.tb.Helper()
	c.update("at + $1::bigint * interval '1 microsecond'", d.Microseconds())
}

func (c *Clock) update(to string, arg any) {
	c.tb.Helper()
	sql := "UPDATE " + pgx.Identifier{c.schema, "clock"}.Sanitize() + " SET at = date_trunc('microseconds', " + to + ")"
	if _, err := c.admin.Exec(context.Background(), sql, arg); err != nil {
		c.tb.Fatalf("pglimittest: Clock: %v", err)
	}
}
