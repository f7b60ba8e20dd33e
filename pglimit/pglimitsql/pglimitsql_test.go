package pglimitsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
	"github.com/pglimit/cooldown/pglimit/pglimitsql"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// sqlDB opens a *sql.DB with pgx's driver on the shared test server, closed
// when the test ends.
func sqlDB(tb testing.TB) *sql.DB {
	tb.Helper()
	db, err := sql.Open("pgx", testdb.URL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// newLimiter builds a limiter on a database/sql pool in a fresh schema.
func newLimiter(t *testing.T, db *sql.DB, cfg pglimit.Config) pglimit.Limiter {
	t.Helper()
	if cfg.Schema == "" {
		cfg.Schema = testdb.Schema(t)
	}
	lim, err := pglimit.New(pglimitsql.DB(db), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// The conformance suite passes with every strategy on a *sql.DB: each of
// the suite's pools becomes a *sql.DB with the same connection settings.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, s := range pglimit.Strategies() {
		t.Run(string(s), func(t *testing.T) {
			if s != pglimit.Upsert {
				testdb.Slow(t) // the quick tier runs the suite on database/sql once
			}
			t.Parallel()
			var mu sync.Mutex
			dbs := map[*pgxpool.Pool]*sql.DB{}
			t.Cleanup(func() {
				for _, db := range dbs {
					db.Close()
				}
			})
			pglimittest.Exercise(t, func(db pglimit.DB, cfg *pglimit.Config) (pglimit.Limiter, error) {
				pool, ok := db.(*pgxpool.Pool)
				if !ok {
					return nil, fmt.Errorf("the suite gave a %T, not a pool", db)
				}
				mu.Lock()
				sdb := dbs[pool]
				if sdb == nil {
					sdb = stdlib.OpenDB(*pool.Config().ConnConfig)
					sdb.SetMaxOpenConns(int(pool.Config().MaxConns))
					dbs[pool] = sdb
				}
				mu.Unlock()
				c := *cfg
				c.Strategy = s
				return pglimit.New(pglimitsql.DB(sdb), &c)
			})
		})
	}
}

// AllowTx in a database/sql transaction counts only if it commits, and
// leaves the caller's lock_timeout as it found it. Every strategy's
// statement is tried, and the general one of several limits, whose answer
// holds an array that database/sql hands over as text.
func TestAllowTxCommitAndRollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlDB(t)
	cases := map[string]pglimit.Config{"two limits": {Limits: []pglimit.Limit{
		{Name: "burst", Rate: 1, Period: time.Hour, Burst: 1},
		{Name: "daily", Algorithm: pglimit.FixedWindow, Rate: 10, Period: 24 * time.Hour},
	}}}
	for _, s := range pglimit.Strategies() {
		cases[string(s)] = pglimit.Config{Strategy: s, Cooldown: time.Hour}
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lim := newLimiter(t, db, cfg)
			decideIn := func(key string, commit bool) pglimit.Decision {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = '7s'"); err != nil {
					t.Fatal(err)
				}
				d, err := lim.AllowTx(ctx, pglimitsql.Tx(tx), key)
				if err != nil {
					t.Fatal(err)
				}
				var lt string
				if err := tx.QueryRowContext(ctx, "SHOW lock_timeout").Scan(&lt); err != nil {
					t.Fatal(err)
				}
				if lt != "7s" {
					t.Fatalf("lock_timeout after AllowTx = %s, want the caller's 7s", lt)
				}
				if commit {
					if err := tx.Commit(); err != nil {
						t.Fatal(err)
					}
				}
				return d
			}
			if d := decideIn("k", false); !d.Allowed {
				t.Fatalf("first AllowTx: %+v, want admitted", d)
			}
			if d := decideIn("k", true); !d.Allowed {
				t.Fatalf("AllowTx after a rolled-back admission: %+v, want admitted (the rollback gave it back)", d)
			}
			if d := decideIn("k", true); d.Allowed {
				t.Fatalf("AllowTx after a committed admission: %+v, want refused", d)
			}
			if d, err := lim.Allow(ctx, "k"); err != nil || d.Allowed {
				t.Fatalf("Allow after a committed AllowTx: %+v, %v; want refused", d, err)
			}
		})
	}
}

// Transactions of two *sql.DB pools race on one key at the isolation
// levels an application may use: exactly one is admitted, and every other
// transaction stays usable and commits.
func TestAllowTxContention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbs := []*sql.DB{sqlDB(t), sqlDB(t)}
	for _, s := range pglimit.Strategies() {
		for _, iso := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable} {
			t.Run(fmt.Sprintf("%s/%s", s, iso), func(t *testing.T) {
				t.Parallel()
				lim := newLimiter(t, dbs[0], pglimit.Config{Strategy: s, Cooldown: time.Hour})
				const n = 8
				txs := make([]*sql.Tx, n)
				for i := range txs {
					tx, err := dbs[i%2].BeginTx(ctx, &sql.TxOptions{Isolation: iso})
					if err != nil {
						t.Fatal(err)
					}
					defer tx.Rollback()
					// Take the snapshot before the race, as a transaction
					// that has already read something has.
					if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil {
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
					var one int
					if err := tx.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
						t.Fatalf("transaction %d unusable after AllowTx: %v", i, err)
					}
					if err := tx.Commit(); err != nil {
						t.Fatalf("commit %d: %v", i, err)
					}
					if admitted[i] {
						got++
					}
				}
				if got != 1 {
					t.Fatalf("%d concurrent AllowTx at %s: %d admitted, want 1", n, iso, got)
				}
				if d, err := lim.Allow(ctx, "k"); err != nil || d.Allowed {
					t.Fatalf("Allow after the race: %+v, %v; want refused", d, err)
				}
			})
		}
	}
}

// A caller's AllowTx that waits past Timeout for another transaction is
// ErrTimeout (or, for NoWait, a refusal), and its transaction carries on.
func TestAllowTxTimeoutKeepsTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlDB(t)
	for _, s := range pglimit.Strategies() {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			lim := newLimiter(t, db, pglimit.Config{Strategy: s, Cooldown: time.Hour, Timeout: 300 * time.Millisecond})
			holder, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback()
			if d, err := lim.AllowTx(ctx, pglimitsql.Tx(holder), "k"); err != nil || !d.Allowed {
				t.Fatalf("holder's AllowTx: %+v, %v", d, err)
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			d, err := lim.AllowTx(ctx, pglimitsql.Tx(tx), "k")
			switch {
			case err == nil && d.Allowed:
				t.Fatal("admitted while another transaction holds an admission")
			case err != nil && !errors.Is(err, pglimit.ErrTimeout):
				t.Fatalf("AllowTx: %v; want ErrTimeout or a refusal", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatalf("commit after AllowTx gave up: %v", err)
			}
		})
	}
}

// Outside a transaction, Tx decides nothing and says why.
func TestTxOutsideTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlDB(t)
	lim := newLimiter(t, db, pglimit.Config{Cooldown: time.Hour})
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if d, err := lim.AllowTx(ctx, pglimitsql.Tx(conn), "k"); err == nil {
		t.Fatalf("AllowTx outside a transaction: %+v, want an error", d)
	}
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("Allow after the failed AllowTx: %+v, %v; want admitted (nothing was counted)", d, err)
	}
}

// A Semaphore's slot acquired in a database/sql transaction is taken only
// if the transaction commits.
func TestAcquireTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlDB(t)
	sem, err := pglimitsem.New(pglimitsql.DB(db), &pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, commit := range []bool{false, true} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := sem.AcquireTx(ctx, pglimitsql.Tx(tx), "k")
		if err != nil || !s.Acquired {
			t.Fatalf("AcquireTx (commit %t): %+v, %v", commit, s, err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if s, err := sem.Acquire(ctx, "k"); err != nil || s.Acquired || s.Held != 1 {
		t.Fatalf("Acquire after one committed AcquireTx: %+v, %v; want refused, 1 held", s, err)
	}
}

// A decision in a database/sql transaction is refunded only once that
// transaction has committed: a rolled-back one took nothing, even when an
// admission after the rollback left the key as it had.
func TestRefundAfterTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlDB(t)
	cases := map[string]pglimit.Config{
		"two limits": {Limits: []pglimit.Limit{
			{Name: "burst", Rate: 5, Period: time.Hour, Burst: 5},
			{Name: "daily", Algorithm: pglimit.FixedWindow, Rate: 5, Period: 24 * time.Hour},
		}},
		"gcra": {Limits: []pglimit.Limit{{Name: "burst", Rate: 5, Period: time.Hour, Burst: 5}}},
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lim := newLimiter(t, db, cfg)
			decideIn := func(commit bool) pglimit.Decision {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				d, err := lim.AllowTx(ctx, pglimitsql.Tx(tx), "k")
				if err != nil || !d.Allowed {
					t.Fatalf("AllowTx: %+v, %v", d, err)
				}
				if commit {
					if err := tx.Commit(); err != nil {
						t.Fatal(err)
					}
				}
				return d
			}
			if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
				t.Fatalf("the first Allow: %+v, %v", d, err)
			}
			rolledBack := decideIn(false)
			if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
				t.Fatalf("Allow after the rollback: %+v, %v", d, err)
			}
			if ok, err := lim.Refund(ctx, rolledBack, 1); err != nil || ok {
				t.Fatalf("Refund of a rolled-back decision: %v, %v; want nothing given back", ok, err)
			}
			if ok, err := lim.Refund(ctx, decideIn(true), 1); err != nil || !ok {
				t.Fatalf("Refund of a committed decision: %v, %v; want given back", ok, err)
			}
			for i := range 4 {
				d, err := lim.Allow(ctx, "k")
				if err != nil || d.Allowed != (i < 3) {
					t.Fatalf("admission %d of the 3 left: %+v, %v", i+1, d, err)
				}
			}
		})
	}
}

// A slot taken and released in one database/sql transaction is free once
// it commits. A release that finds no slot (ErrSlotLost) still ends its
// savepoint and restores the caller's lock_timeout.
func TestReleaseTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqlDB(t)
	sem, err := pglimitsem.New(pglimitsql.DB(db), &pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "SET LOCAL lock_timeout = '7s'"); err != nil {
		t.Fatal(err)
	}
	s, err := sem.AcquireTx(ctx, pglimitsql.Tx(tx), "k")
	if err != nil || !s.Acquired {
		t.Fatalf("AcquireTx: %+v, %v", s, err)
	}
	if err := sem.ReleaseTx(ctx, pglimitsql.Tx(tx), s); err != nil {
		t.Fatalf("ReleaseTx: %v", err)
	}
	if err := sem.ReleaseTx(ctx, pglimitsql.Tx(tx), s); !errors.Is(err, pglimitsem.ErrSlotLost) {
		t.Fatalf("second ReleaseTx: %v, want ErrSlotLost", err)
	}
	var lt string
	if err := tx.QueryRowContext(ctx, "SHOW lock_timeout").Scan(&lt); err != nil || lt != "7s" {
		t.Fatalf("lock_timeout after ReleaseTx = %q, %v; want the caller's 7s", lt, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if s, err := sem.Acquire(ctx, "k"); err != nil || !s.Acquired {
		t.Fatalf("Acquire after the commit: %+v, %v; want the slot ReleaseTx freed", s, err)
	}
}
