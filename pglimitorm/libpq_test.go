package pglimitorm_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"sync"
	"testing"
	"time"

	_ "github.com/lib/pq" // database/sql driver "postgres"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsql"
)

// libpq opens a *sql.DB with lib/pq on the test server. lib/pq requires
// TLS unless told otherwise, where pgx tries it and falls back; the test
// server is on loopback and has none.
func libpq(t *testing.T) *sql.DB {
	t.Helper()
	u, err := url.Parse(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	if q := u.Query(); !q.Has("sslmode") {
		q.Set("sslmode", "disable")
		u.RawQuery = q.Encode()
	}
	db, err := sql.Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// newLimiter builds a limiter on a *sql.DB opened with pgx's driver.
func newLimiter(t *testing.T, cfg pglimit.Config) pglimit.Limiter {
	t.Helper()
	db, err := sql.Open("pgx", testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	cfg.Schema = testdb.Schema(t)
	lim, err := pglimit.New(pglimitsql.DB(db), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// limitSets are the two kinds of statement AllowTx sends: a single GCRA
// limit's, and the general one of several limits, whose answer holds an
// array that lib/pq returns as text.
var limitSets = map[string]pglimit.Config{
	"cooldown": {Cooldown: time.Hour},
	"two limits": {Limits: []pglimit.Limit{
		{Name: "burst", Rate: 1, Period: time.Hour, Burst: 1},
		{Name: "daily", Algorithm: pglimit.FixedWindow, Rate: 10, Period: 24 * time.Hour},
	}},
}

// AllowTx in a lib/pq transaction counts only if it commits.
func TestLibPQCommitAndRollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := libpq(t)
	for name, cfg := range limitSets {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lim := newLimiter(t, cfg)
			decideIn := func(commit bool) pglimit.Decision {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				d, err := lim.AllowTx(ctx, pglimitsql.Tx(tx), "k")
				if err != nil {
					t.Fatal(err)
				}
				if commit {
					if err := tx.Commit(); err != nil {
						t.Fatal(err)
					}
				}
				return d
			}
			if d := decideIn(false); !d.Allowed {
				t.Fatalf("first AllowTx: %+v, want admitted", d)
			}
			if d := decideIn(true); !d.Allowed {
				t.Fatalf("AllowTx after a rollback: %+v, want admitted", d)
			}
			d := decideIn(true)
			if d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > time.Hour {
				t.Fatalf("AllowTx after a commit: %+v, want refused for up to an hour", d)
			}
		})
	}
}

// lib/pq transactions race on one key: exactly one is admitted, and a lost
// race (a serialization failure at REPEATABLE READ, reported in lib/pq's
// error type) is a refusal that leaves the transaction usable.
func TestLibPQContention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := libpq(t)
	for _, iso := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead} {
		t.Run(iso.String(), func(t *testing.T) {
			t.Parallel()
			lim := newLimiter(t, pglimit.Config{Cooldown: time.Hour})
			const n = 6
			txs := make([]*sql.Tx, n)
			for i := range txs {
				tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil { // take the snapshot
					t.Fatal(err)
				}
				txs[i] = tx
			}
			admitted := make([]bool, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i, tx := range txs {
				wg.Go(func() {
					d, err := lim.AllowTx(ctx, pglimitsql.Tx(tx), "k")
					admitted[i], errs[i] = d.Allowed, err
				})
			}
			wg.Wait()
			got := 0
			for i, tx := range txs {
				if errs[i] != nil && !errors.Is(errs[i], pglimit.ErrTimeout) {
					t.Fatalf("AllowTx %d: %v", i, errs[i])
				}
				if err := tx.Commit(); err != nil {
					t.Fatalf("commit %d: %v", i, err)
				}
				if admitted[i] {
					got++
				}
			}
			if got != 1 {
				t.Fatalf("%d concurrent AllowTx: %d admitted, want 1", n, got)
			}
		})
	}
}

// A limiter's own *sql.DB must be pgx's: on lib/pq every decision fails
// with ErrUnsupported, and says what to do.
func TestLibPQLimiterUnsupported(t *testing.T) {
	t.Parallel()
	lim, err := pglimit.New(pglimitsql.DB(libpq(t)), &pglimit.Config{Schema: testdb.Schema(t), Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	d, err := lim.Allow(context.Background(), "k")
	if !errors.Is(err, pglimit.ErrUnsupported) {
		t.Fatalf("Allow on a lib/pq *sql.DB: %+v, %v; want ErrUnsupported", d, err)
	}
	t.Log(err)
}
