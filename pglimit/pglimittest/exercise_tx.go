package pglimittest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
)

// exerciseTransactions checks AllowTx under contention: several callers'
// transactions racing on one key, at the isolation levels an application
// may run them at. Exactly one is admitted, and the others' transactions
// stay usable: a lost race is a refusal, never an aborted transaction.
func (s *suite) exerciseTransactions(t *testing.T) {
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		for _, tc := range []struct {
			name     string
			cooldown time.Duration
			prepare  func(t *testing.T, lim pglimit.Limiter, key string) // before the race
			admitted int
		}{
			{"FirstKey", time.Minute, func(*testing.T, pglimit.Limiter, string) {}, 1},
			{"CooldownEnded", endedCooldown, func(t *testing.T, lim pglimit.Limiter, key string) {
				mustAllow(t, lim, key)
				time.Sleep(endedCooldown + 20*time.Millisecond)
			}, 1},
			{"InCooldown", time.Minute, func(t *testing.T, lim pglimit.Limiter, key string) { mustAllow(t, lim, key) }, 0},
		} {
			t.Run(fmt.Sprintf("AllowTxContention/%s/%s", iso, tc.name), func(t *testing.T) {
				lim, b := s.setup(t, tc.cooldown)
				pools := []*pgxpool.Pool{b.pool, s.opts.pool(t)}
				tc.prepare(t, lim, "k")
				start := time.Now()
				got, err := raceTx(t, lim, pools, 8, iso, "k")
				if err != nil {
					t.Fatal(err)
				}
				// A race slower than the cooldown may rightly admit again:
				// each admission's cooldown starts at its write.
				most := tc.admitted + int(time.Since(start)/tc.cooldown)
				if got < tc.admitted || got > most {
					t.Fatalf("8 concurrent AllowTx: %d admitted after commit, want %d (at most %d)", got, tc.admitted, most)
				}
				if tc.admitted == 1 && got == 1 {
					if d := mustAllow(t, lim, "k"); d.Allowed && time.Since(start) < tc.cooldown {
						t.Fatalf("after the committed race: %+v, want refused (the admission is consumed)", d)
					}
				}
			})
		}
	}

	t.Run("AllowTxTimeoutKeepsTransaction", func(t *testing.T) {
		// A caller's transaction holds the key's first admission open; a
		// second caller's AllowTx gives up after Timeout (NoWait may refuse
		// at once) and its transaction carries on.
		lim, b := s.setup(t, time.Minute)
		ctx := context.Background()
		hold(t, lim, b.pool, "k")
		const timeout = 300 * time.Millisecond
		timed := mustNew(t, s.newLimiter, b.pool, &pglimit.Config{Schema: b.schema, Cooldown: time.Minute, Timeout: timeout})
		tx, err := s.opts.pool(t).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		start := time.Now()
		d, err := timed.AllowTx(ctx, tx, "k")
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("AllowTx took %s with a %s Timeout", took, timeout)
		}
		switch {
		case err == nil && d.Allowed:
			t.Fatal("admitted while another transaction holds an admission")
		case err != nil && !errors.Is(err, pglimit.ErrTimeout):
			t.Fatalf("AllowTx: %v; want ErrTimeout or a refusal", err)
		}
		var one int
		if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			t.Fatalf("caller's transaction unusable after AllowTx gave up: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("commit after AllowTx gave up: %v", err)
		}
	})
}

// endedCooldown is a cooldown short enough to wait out before a race,
// long enough that the race usually finishes within it on a slow machine.
const endedCooldown = 2 * time.Second

// raceTx opens n transactions at isolation level iso, spread over pools,
// calls AllowTx for key in all of them at once, checks that each
// transaction is still usable, commits them all and returns how many were
// admitted.
func raceTx(t *testing.T, lim pglimit.Limiter, pools []*pgxpool.Pool, n int, iso pgx.TxIsoLevel, key string) (admitted int, errs error) {
	t.Helper()
	ctx := context.Background()
	txs := make([]pgx.Tx, n)
	for i := range txs {
		tx, err := pools[i%len(pools)].BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		// Take the snapshot now, as a transaction that did work before
		// asking the limiter would have.
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		txs[i] = tx
	}
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for i, tx := range txs {
		wg.Go(func() {
			<-start
			d, err := lim.AllowTx(ctx, tx, key)
			if err == nil {
				_, err = tx.Exec(ctx, "SELECT 1")
				if err != nil {
					err = fmt.Errorf("transaction %d unusable after AllowTx (%+v): %w", i, d, err)
				}
			}
			if err == nil {
				err = tx.Commit(ctx)
			}
			mu.Lock()
			defer mu.Unlock()
			if d.Allowed && err == nil {
				admitted++
			}
			errs = errors.Join(errs, err)
		})
	}
	close(start)
	wg.Wait()
	return admitted, errs
}

// exerciseClock checks that a cooldown starts when its decision writes,
// not when its statement started: a decision that waited for another
// transaction's hold on the key must not write a cooldown that has already
// partly passed.
func (s *suite) exerciseClock(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ended bool // the key has a row whose cooldown has ended
	}{{"ExistingKey", true}, {"FirstKey", false}} {
		t.Run("CooldownStartsAtWrite/"+tc.name, func(t *testing.T) {
			const (
				cooldown = time.Second
				holdFor  = 3 * cooldown / 2 // held longer than the cooldown
			)
			lim, b := s.setup(t, cooldown)
			ctx := context.Background()
			if tc.ended {
				mustAllow(t, lim, "k")
				time.Sleep(cooldown + 20*time.Millisecond)
			}
			holder := hold(t, lim, b.pool, "k")
			waiter := mustNew(t, s.newLimiter, s.opts.pool(t), &pglimit.Config{Schema: b.schema, Cooldown: cooldown, Timeout: 10 * time.Second})
			type result struct {
				d   pglimit.Decision
				err error
			}
			done := make(chan result, 1)
			go func() {
				d, err := waiter.Allow(ctx, "k")
				done <- result{d, err}
			}()
			time.Sleep(holdFor)
			rolledBack := time.Now()
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatalf("the waiting request: %v", r.err)
			}
			if !r.d.Allowed {
				return // NoWait refused without waiting: nothing was written
			}
			// The waiting request wrote its row after the rollback, so its
			// cooldown runs at least until rolledBack + cooldown.
			sent := time.Now()
			d, err := lim.Allow(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if sent.Sub(rolledBack) >= cooldown {
				t.Skipf("the machine took %s to send the next request; the cooldown had ended", sent.Sub(rolledBack))
			}
			if d.Allowed {
				t.Fatalf("admitted %s after the waiting request was admitted (%+v); cooldown is %s, counted from its write",
					sent.Sub(rolledBack), r.d, cooldown)
			}
		})
	}
}

// hold admits key in a transaction it leaves open, rolled back when the test
// ends, and returns it.
func hold(t *testing.T, lim pglimit.Limiter, pool *pgxpool.Pool, key string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if d, err := lim.AllowTx(ctx, tx, key); err != nil || !d.Allowed {
		t.Fatalf("holder's AllowTx: %+v, %v", d, err)
	}
	return tx
}
