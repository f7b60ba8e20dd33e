package pglimitsem_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// waiters counts key's live places in the queue.
func waiters(t testing.TB, db pglimit.DB, schema, key string) int {
	t.Helper()
	var n int
	q := fmt.Sprintf("SELECT count(*) FROM %s WHERE key = $1 AND expires_at > clock_timestamp()", pgx.Identifier{schema, "pglimit_slot_waiters"}.Sanitize())
	if err := db.QueryRow(context.Background(), q, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
	}
}

// Waiters of two instances, one through PgBouncer, take the one slot of a
// key in the order they began to wait, each as the one before releases
// it, and leave no place behind.
func TestWaitInArrivalOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	cfg := pglimitsem.Config{Schema: schema, Slots: 1, TTL: time.Minute}
	pool := testdb.Pool(t)
	sems := []*pglimitsem.Semaphore{newSemaphore(t, pool, cfg), newSemaphore(t, testdb.PgBouncerPool(t), cfg)}
	first, err := sems[0].Acquire(ctx, "k")
	if err != nil || !first.Acquired {
		t.Fatalf("Acquire: %+v, %v", first, err)
	}
	const n = 8
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range n {
		wg.Go(func() {
			sem := sems[i%2]
			slot, err := sem.Wait(ctx, "k")
			if err != nil || !slot.Acquired {
				t.Errorf("waiter %d: %+v, %v", i, slot, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			if err := sem.Release(ctx, slot); err != nil {
				t.Errorf("waiter %d: Release: %v", i, err)
			}
		})
		// The next waiter begins once this one has its place.
		waitFor(t, fmt.Sprintf("waiter %d's place", i), func() bool { return waiters(t, pool, schema, "k") == i+1 })
	}
	if err := sems[0].Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if want := []int{0, 1, 2, 3, 4, 5, 6, 7}; !slices.Equal(order, want) {
		t.Errorf("the waiters took the slot in the order %v, want %v", order, want)
	}
	if w := waiters(t, pool, schema, "k"); w != 0 {
		t.Errorf("%d places left in the queue", w)
	}
}

// A waiter whose context ends returns its cause within Timeout, leaves
// the queue, and holds up no waiter behind it.
func TestWaitGivesUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 1, TTL: time.Minute})
	held, err := sem.Acquire(ctx, "k")
	if err != nil || !held.Acquired {
		t.Fatalf("Acquire: %+v, %v", held, err)
	}
	gone := errors.New("the client went away")
	short, cancel := context.WithTimeoutCause(ctx, 200*time.Millisecond, gone)
	defer cancel()
	start := time.Now()
	slot, err := sem.Wait(short, "k")
	if took := time.Since(start); !errors.Is(err, gone) || slot.Acquired || took > 200*time.Millisecond+boundSlack {
		t.Fatalf("Wait past its context: %+v, %v after %s; want the context's cause within %s", slot, err, took, boundSlack)
	}
	if w := waiters(t, pool, schema, "k"); w != 0 {
		t.Fatalf("%d places left by a waiter that gave up", w)
	}
	done := make(chan error, 1)
	go func() {
		slot, err := sem.Wait(ctx, "k")
		if err == nil && !slot.Acquired {
			err = fmt.Errorf("Wait returned %+v", slot)
		}
		done <- err
	}()
	waitFor(t, "the second waiter's place", func() bool { return waiters(t, pool, schema, "k") == 1 })
	if err := sem.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the waiter after one that gave up: %v", err)
	}
}

// A waiter whose context ends while its statement is in flight (here a
// long transaction holds the slots' table) returns the context's cause,
// as one whose context ends between its tries does: the driver's error
// for the cut-off statement says only "context deadline exceeded".
func TestWaitCutOffReturnsCause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 1, TTL: time.Minute, Timeout: 10 * time.Second})
	held, err := sem.Acquire(ctx, "k")
	if err != nil || !held.Acquired {
		t.Fatalf("Acquire: %+v, %v", held, err)
	}
	testdb.Lock(t, testdb.Pool(t), schema, "pglimit_slots")
	gone := errors.New("the client went away")
	short, cancel := context.WithTimeoutCause(ctx, 200*time.Millisecond, gone)
	defer cancel()
	start := time.Now()
	slot, err := sem.Wait(short, "k")
	if took := time.Since(start); !errors.Is(err, gone) || !errors.Is(err, context.DeadlineExceeded) || slot.Acquired || took > 200*time.Millisecond+boundSlack {
		t.Fatalf("Wait cut off in its statement: %+v, %v after %s; want the context's cause within %s", slot, err, took, boundSlack)
	}
}

// The place of a waiter that died (it renews it no more) stops counting
// when it lapses: the waiter behind it then takes the slot.
func TestWaitPastDeadWaiter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Namespace: "ns", Slots: 1, TTL: time.Minute})
	// A place ahead of any other, lapsing 1 s from now.
	if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (namespace, key, arrived, waiter, expires_at)
		VALUES ('ns', 'k', 0, gen_random_uuid(), clock_timestamp() + interval '1 second')`,
		pgx.Identifier{schema, "pglimit_slot_waiters"}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	slot, err := sem.Wait(ctx, "k")
	took := time.Since(start)
	if err != nil || !slot.Acquired {
		t.Fatalf("Wait behind a dead waiter: %+v, %v", slot, err)
	}
	if took < 900*time.Millisecond {
		t.Errorf("Wait took the slot after %s, while a live place was ahead of it", took)
	}
	t.Logf("took the slot %s after the dead waiter's place began to lapse", took)
}

// BenchmarkWaitWake measures how long after a Release a waiter holds the
// slot, as the median and 90th percentile of its rounds (run it with
// -benchtime=50x for 50): woken by the release in its own process, or,
// in another instance, at its next poll (WaitPoll 50ms) or by the
// release's notification (Config.Listen).
func BenchmarkWaitWake(b *testing.B) {
	ctx := context.Background()
	schema := testdb.Schema(b)
	cfg := pglimitsem.Config{Schema: schema, Slots: 1, TTL: time.Minute}
	pool := testdb.Pool(b)
	holder := newSemaphore(b, pool, cfg)
	other := testdb.Pool(b)
	listening := cfg
	listening.Listen = other.Config().ConnConfig
	for _, bc := range []struct {
		name        string
		holder, sem *pglimitsem.Semaphore
	}{
		{"same-process", holder, holder},
		{"other-instance-poll", holder, newSemaphore(b, other, cfg)},
		{"other-instance-notify", newSemaphore(b, pool, listening), newSemaphore(b, other, listening)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var took []time.Duration
			for i := 0; b.Loop(); i++ {
				key := fmt.Sprint(bc.name, i)
				held, err := bc.holder.Acquire(ctx, key)
				if err != nil || !held.Acquired {
					b.Fatalf("Acquire: %+v, %v", held, err)
				}
				got := make(chan time.Time, 1)
				go func() {
					slot, err := bc.sem.Wait(ctx, key)
					if err != nil {
						b.Error(err)
					}
					got <- time.Now()
					bc.sem.Release(ctx, slot) //nolint:errcheck // the next key is another
				}()
				waitFor(b, "the waiter's place", func() bool { return waiters(b, pool, schema, key) == 1 })
				released := time.Now()
				if err := bc.holder.Release(ctx, held); err != nil {
					b.Fatal(err)
				}
				took = append(took, (<-got).Sub(released))
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "ms/wake-p50")
			b.ReportMetric(float64(took[len(took)*9/10].Microseconds())/1000, "ms/wake-p90")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// A waiter whose context ends while its join statement runs leaves no
// place behind: the waiter after it takes a released slot at once, not
// when the abandoned place lapses (4 s here). A trigger slows the join of
// the cancelled waiter's connections (0.5 s); once the join runs, the
// proxy between stalls and the waiter's context ends, so that the
// driver's cancel request is held back, as by a slow network, until the
// join has committed. So for Wait's join, and for WaitFlow's join and
// first try in turn, each with its statements prepared (pgx's default)
// and in QueryExecModeExec, as behind PgBouncer.
func TestWaitCancelledJoinLeaves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	fn := pgx.Identifier{schema, "slow_join"}.Sanitize()
	for _, q := range []string{
		`CREATE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF current_setting('application_name') = 'slow join' THEN PERFORM pg_sleep(0.5); END IF;
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER slow_join BEFORE INSERT ON ` + pgx.Identifier{schema, "pglimit_slot_waiters"}.Sanitize() +
			` FOR EACH ROW EXECUTE FUNCTION ` + fn + `()`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// joining counts the slow joins the server runs, or with sleeping
	// those in their trigger's sleep.
	joining := func(sleeping bool) int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'slow join' AND state = 'active' AND (NOT $1 OR wait_event = 'PgSleep')`, sleeping).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	cfg := pglimitsem.Config{Schema: schema, Slots: 1, TTL: time.Minute, WaitPoll: 200 * time.Millisecond} // places last 4 s
	sem := newSemaphore(t, pool, cfg)
	type slowOne struct {
		mode  pgx.QueryExecMode
		proxy *testdb.StallProxy
		sem   *pglimitsem.Semaphore
	}
	var slows []slowOne
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		proxy, pcfg := testdb.NewStallProxy(t)
		pcfg.ConnConfig.RuntimeParams["application_name"] = "slow join"
		pcfg.ConnConfig.DefaultQueryExecMode = mode
		slowPool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(slowPool.Close)
		if _, err := slowPool.Exec(ctx, "SELECT 1"); err != nil { // the join goes over an open connection
			t.Fatal(err)
		}
		slows = append(slows, slowOne{mode, proxy, newSemaphore(t, slowPool, cfg)})
	}
	for _, tc := range []struct {
		name string
		wait func(ctx context.Context, sem *pglimitsem.Semaphore, key string) (pglimitsem.Slot, error)
	}{
		{"Wait", func(ctx context.Context, sem *pglimitsem.Semaphore, key string) (pglimitsem.Slot, error) {
			return sem.Wait(ctx, key)
		}},
		{"WaitFlow", func(ctx context.Context, sem *pglimitsem.Semaphore, key string) (pglimitsem.Slot, error) {
			return sem.WaitFlow(ctx, key, pglimitsem.Flow{Name: "f", Weight: 1})
		}},
	} {
		for _, slow := range slows {
			proxy, name := slow.proxy, fmt.Sprintf("%s, %v", tc.name, slow.mode)
			key := name
			held, err := sem.Acquire(ctx, key)
			if err != nil || !held.Acquired {
				t.Fatalf("%s: Acquire: %+v, %v", name, held, err)
			}
			short, cancel := context.WithCancel(ctx)
			gaveUp := make(chan error, 1)
			go func() {
				slot, err := tc.wait(short, slow.sem, key)
				if err == nil && slot.Acquired {
					err = fmt.Errorf("took %+v", slot)
				}
				gaveUp <- err
			}()
			waitFor(t, name+"'s join to run", func() bool { return joining(true) == 1 })
			proxy.Stall()
			cancel()
			if err := <-gaveUp; !errors.Is(err, context.Canceled) {
				t.Fatalf("%s cut off in its join: %v; want context.Canceled", name, err)
			}
			waitFor(t, name+"'s join to commit", func() bool { return joining(false) == 0 })
			proxy.Unstall()
			got := make(chan time.Time, 1)
			go func() {
				slot, err := tc.wait(ctx, sem, key)
				if err != nil || !slot.Acquired {
					t.Errorf("%s: the next waiter: %+v, %v", name, slot, err)
				}
				got <- time.Now()
				_ = sem.Release(ctx, slot)
			}()
			time.Sleep(100 * time.Millisecond) // the next waiter joins
			released := time.Now()
			if err := sem.Release(ctx, held); err != nil {
				t.Fatal(err)
			}
			waitFor(t, name+"'s removal to end", func() bool { return pglimitsem.Leaving(slow.sem) == 0 })
			if took := (<-got).Sub(released); took > 2*time.Second {
				t.Errorf("%s: the next waiter took the released slot after %s: the cancelled join's place held it back", name, took)
			} else {
				t.Logf("%s: the next waiter took the released slot after %s", name, took)
			}
		}
	}
}
