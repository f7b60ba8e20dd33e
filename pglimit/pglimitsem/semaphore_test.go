package pglimitsem_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

func newSemaphore(t testing.TB, db pglimit.DB, cfg pglimitsem.Config) *pglimitsem.Semaphore {
	t.Helper()
	s, err := pglimitsem.New(db, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// heldSlots counts the live slots of key in schema.
func heldSlots(t *testing.T, db pglimit.DB, schema, key string) int {
	t.Helper()
	var n int
	q := fmt.Sprintf("SELECT count(*) FROM %s WHERE key = $1 AND expires_at > now()", pgx.Identifier{schema, "pglimit_slots"}.Sanitize())
	if err := db.QueryRow(context.Background(), q, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// N+k acquirers of two instances at once: exactly N get a slot, each
// refusal knows the slots are held, and after the N release the next
// round gets exactly N again.
func TestSemaphoreContention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	cfg := pglimitsem.Config{Schema: schema, Slots: 3, TTL: time.Minute}
	sems := []*pglimitsem.Semaphore{newSemaphore(t, testdb.Pool(t), cfg), newSemaphore(t, testdb.Pool(t), cfg)}
	for round := range 3 {
		const acquirers = 12
		slots := make([]pglimitsem.Slot, acquirers)
		var wg sync.WaitGroup
		for i := range acquirers {
			wg.Go(func() {
				s, err := sems[i%2].Acquire(ctx, "user-1")
				if err != nil {
					t.Error(err)
				}
				slots[i] = s
			})
		}
		wg.Wait()
		got := 0
		for _, s := range slots {
			switch {
			case s.Acquired:
				got++
				if s.ExpiresIn <= 0 || s.ExpiresIn > time.Minute {
					t.Errorf("acquired slot expires in %s, want within the minute's TTL", s.ExpiresIn)
				}
			case s.Held != 3 || s.RetryAfter <= 0 || s.RetryAfter > time.Minute:
				t.Errorf("refusal %+v: want 3 held and a wait within the TTL", s)
			}
		}
		if got != 3 {
			t.Fatalf("round %d: %d of %d acquirers got a slot, want 3", round, got, acquirers)
		}
		if n := heldSlots(t, testdb.Pool(t), schema, "user-1"); n != 3 {
			t.Fatalf("round %d: %d slots held in the table, want 3", round, n)
		}
		for i, s := range slots {
			if s.Acquired {
				if err := sems[i%2].Release(ctx, s); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// Acquisitions in callers' transactions race at the isolation levels an
// application may use: exactly N are held once they commit, and every
// transaction stays usable.
func TestSemaphoreAcquireTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			// Pools of the subtest's own: its 8 transactions hold every
			// connection of both, and a subtest running beside it on the
			// same pools would wait for them while holding some itself.
			pools := []*pgxpool.Pool{testdb.Pool(t), testdb.Pool(t)}
			schema := testdb.Schema(t)
			sem := newSemaphore(t, pools[0], pglimitsem.Config{Schema: schema, Slots: 2, TTL: time.Minute, Timeout: 5 * time.Second})
			const n = 8
			txs := make([]pgx.Tx, n)
			for i := range txs {
				tx, err := pools[i%2].BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx)
				if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // take the snapshot
					t.Fatal(err)
				}
				txs[i] = tx
			}
			acquired := make([]bool, n)
			var wg sync.WaitGroup
			for i, tx := range txs {
				wg.Go(func() {
					s, err := sem.AcquireTx(ctx, tx, "user-1")
					if err != nil {
						t.Error(err)
					}
					acquired[i] = s.Acquired
				})
			}
			wg.Wait()
			got := 0
			for i, tx := range txs {
				if err := tx.Commit(ctx); err != nil {
					t.Fatalf("commit %d: %v", i, err)
				}
				if acquired[i] {
					got++
				}
			}
			if got != 2 {
				t.Fatalf("%d AcquireTx at %s: %d acquired, want 2", n, iso, got)
			}
			if h := heldSlots(t, pools[0], schema, "user-1"); h != 2 {
				t.Fatalf("%d slots held after the commits, want 2", h)
			}
		})
	}
}

// A slot acquired in a transaction that rolls back was never taken.
func TestSemaphoreAcquireTxRollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1})
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := sem.AcquireTx(ctx, tx, "k"); err != nil || !s.Acquired {
		t.Fatalf("AcquireTx: %+v, %v", s, err)
	}
	if s, err := sem.Acquire(ctx, "k"); err != nil || s.Acquired || s.Held != 1 {
		t.Fatalf("Acquire while the transaction holds the slot: %+v, %v; want refused, 1 held", s, err)
	}
	// A refusal writes nothing: the refused transaction has no id.
	other, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if s, err := sem.AcquireTx(ctx, other, "k"); err != nil || s.Acquired {
		t.Fatalf("AcquireTx while another transaction holds the slot: %+v, %v; want refused", s, err)
	}
	var xid *int64
	if err := other.QueryRow(ctx, "SELECT pg_current_xact_id_if_assigned()::text::bigint").Scan(&xid); err != nil || xid != nil {
		t.Fatalf("the refused transaction's id: %v, %v; want none (nothing written)", xid, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if s, err := sem.Acquire(ctx, "k"); err != nil || !s.Acquired {
		t.Fatalf("Acquire after the rollback: %+v, %v; want acquired", s, err)
	}
}

// A holder whose connection dies keeps its slot until the lease ends,
// not a moment less, and then the slot returns by itself.
func TestSemaphoreDeadHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := pglimittest.NewClock(t)
	pool := clock.Pool(t)
	const ttl = 3 * time.Second
	cfg := pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1, TTL: ttl}
	holder, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	s, err := newSemaphore(t, holder.Conn(), cfg).Acquire(ctx, "k")
	if err != nil || !s.Acquired {
		t.Fatalf("Acquire: %+v, %v", s, err)
	}
	// The holder dies: its session ends.
	if _, err := testdb.Pool(t).Exec(ctx, "SELECT pg_terminate_backend($1)", holder.Conn().PgConn().PID()); err != nil {
		t.Fatal(err)
	}

	other := newSemaphore(t, pool, cfg)
	acquired := func() bool {
		t.Helper()
		s, err := other.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		return s.Acquired
	}
	if acquired() {
		t.Fatal("the dead holder's slot came back at once")
	}
	clock.Advance(ttl - time.Microsecond)
	if acquired() {
		t.Fatalf("the dead holder's slot came back 1 µs before its %s lease ended", ttl)
	}
	clock.Advance(time.Microsecond)
	if !acquired() {
		t.Fatalf("the dead holder's slot did not come back when its %s lease ended", ttl)
	}
}

// Release frees a slot once: twice, or after the lease ended and another
// caller took the slot, it reports ErrSlotLost and frees nothing.
func TestSemaphoreRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1, TTL: time.Second})
	a, err := sem.Acquire(ctx, "k")
	if err != nil || !a.Acquired {
		t.Fatalf("Acquire: %+v, %v", a, err)
	}
	if err := sem.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := sem.Release(ctx, a); !errors.Is(err, pglimitsem.ErrSlotLost) {
		t.Fatalf("second Release: %v, want ErrSlotLost", err)
	}
	if err := sem.Release(ctx, pglimitsem.Slot{}); !errors.Is(err, pglimitsem.ErrSlotLost) {
		t.Fatalf("Release of a slot never acquired: %v, want ErrSlotLost", err)
	}

	a, err = sem.Acquire(ctx, "k")
	if err != nil || !a.Acquired {
		t.Fatalf("Acquire: %+v, %v", a, err)
	}
	time.Sleep(a.ExpiresIn + 50*time.Millisecond)
	b, err := sem.Acquire(ctx, "k")
	if err != nil || !b.Acquired {
		t.Fatalf("Acquire after the lease ended: %+v, %v", b, err)
	}
	if err := sem.Release(ctx, a); !errors.Is(err, pglimitsem.ErrSlotLost) {
		t.Fatalf("Release after the lease ended: %v, want ErrSlotLost", err)
	}
	if _, err := sem.Extend(ctx, a); !errors.Is(err, pglimitsem.ErrSlotLost) {
		t.Fatalf("Extend after the lease ended: %v, want ErrSlotLost", err)
	}
	if c, err := sem.Acquire(ctx, "k"); err != nil || c.Acquired {
		t.Fatalf("Acquire while b holds the slot: %+v, %v; want refused (a's release freed nothing)", c, err)
	}
}

// A holder that extends its lease keeps the slot past its TTL while
// others keep trying, and loses it to them once it stops.
func TestSemaphoreExtend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	cfg := pglimitsem.Config{Schema: schema, Slots: 1, TTL: time.Second}
	sem := newSemaphore(t, testdb.Pool(t), cfg)
	held, err := sem.Acquire(ctx, "k")
	if err != nil || !held.Acquired {
		t.Fatalf("Acquire: %+v, %v", held, err)
	}
	var stolen atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		// The others' slots last: one of them, once it has the slot, keeps
		// it from the rest.
		long := cfg
		long.TTL = time.Minute
		other := newSemaphore(t, testdb.Pool(t), long)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if s, err := other.Acquire(ctx, "k"); err == nil && s.Acquired {
					stolen.Add(1)
					return
				}
			}
		})
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		time.Sleep(held.ExpiresIn / 4)
		if held, err = sem.Extend(ctx, held); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("Extend: %v (after %d acquisitions by others)", err, stolen.Load())
		}
	}
	if n := stolen.Load(); n != 0 {
		t.Fatalf("others acquired the slot %d times while its holder extended it", n)
	}
	if err := sem.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); stolen.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("nobody acquired the released slot")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if n := stolen.Load(); n != 1 {
		t.Fatalf("after the release, %d others acquired the slot, want 1", n)
	}
}

// Bad configuration and keys are refused with typed errors, and write
// nothing.
func TestSemaphoreBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	for name, cfg := range map[string]*pglimitsem.Config{
		"nil":              nil,
		"no slots":         {Schema: schema},
		"too many slots":   {Schema: schema, Slots: 10_001},
		"ttl too short":    {Schema: schema, Slots: 1, TTL: time.Millisecond},
		"negative ttl":     {Schema: schema, Slots: 1, TTL: -time.Second},
		"bad namespace":    {Schema: schema, Slots: 1, Namespace: "a\x00b"},
		"bad schema":       {Schema: `x"; DROP TABLE y; --`, Slots: 1},
		"negative timeout": {Schema: schema, Slots: 1, Timeout: -1},
	} {
		if _, err := pglimitsem.New(pool, cfg); !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	// The errors name the field, Slots.
	for name, cfg := range map[string]*pglimitsem.Config{"nil": nil, "no slots": {Schema: schema}} {
		if _, err := pglimitsem.New(pool, cfg); err == nil || !strings.Contains(err.Error(), "Slots") || strings.Contains(err.Error(), "Limit") {
			t.Errorf("%s: %v, want an error that names Slots", name, err)
		}
	}
	if _, err := pglimitsem.New(nil, &pglimitsem.Config{Slots: 1}); !errors.Is(err, pglimit.ErrInvalidConfig) {
		t.Errorf("nil db: %v, want ErrInvalidConfig", err)
	}
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 1})
	for _, key := range []string{"", strings.Repeat("k", pglimit.MaxKeyLength+1), "\xff", "a\x00b"} {
		if s, err := sem.Acquire(ctx, key); !errors.Is(err, pglimit.ErrInvalidKey) || s.Acquired {
			t.Errorf("Acquire(%q): %+v, %v; want ErrInvalidKey", key, s, err)
		}
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "pglimit_slots"}.Sanitize()).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d rows after bad input, %v; want none", rows, err)
	}
}

// The cleaner deletes slots whose lease ended, and leaves held ones.
func TestCleanerDeletesEndedSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 5, TTL: time.Second})
	long := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Namespace: "long", Slots: 1, TTL: time.Hour})
	for i := range 5 {
		if s, err := sem.Acquire(ctx, fmt.Sprint("k", i)); err != nil || !s.Acquired {
			t.Fatalf("Acquire: %+v, %v", s, err)
		}
	}
	if s, err := long.Acquire(ctx, "k"); err != nil || !s.Acquired {
		t.Fatalf("Acquire: %+v, %v", s, err)
	}
	// Two places in the queue of waiters, of waiters that died: one
	// lapsed, one that lasts an hour.
	if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (namespace, key, arrived, waiter, expires_at)
		VALUES ('long', 'dead', 1, gen_random_uuid(), clock_timestamp()), ('long', 'live', 1, gen_random_uuid(), clock_timestamp() + interval '1 hour')`,
		pgx.Identifier{schema, "pglimit_slot_waiters"}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	c, err := pglimitclean.New(pool, &pglimitclean.Config{Schema: schema, Tables: []string{"pglimit_slots"}, Interval: 20 * time.Millisecond, Retention: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	table := pgx.Identifier{schema, "pglimit_slots"}.Sanitize()
	for deadline := time.Now().Add(30 * time.Second); ; {
		var rows int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if rows == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d slot rows left, want the one held", rows)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := heldSlots(t, pool, schema, "k"); n != 1 {
		t.Fatalf("%d held slots, want long's", n)
	}
	var places []string
	waiters := pgx.Identifier{schema, "pglimit_slot_waiters"}.Sanitize()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		rows, err := pool.Query(ctx, "SELECT key FROM "+waiters)
		if err != nil {
			t.Fatal(err)
		}
		if places, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
		if len(places) == 1 || time.Now().After(deadline) {
			break
		}
	}
	if !slices.Equal(places, []string{"live"}) {
		t.Fatalf("places left in the queue of waiters: %v, want the live one", places)
	}
}

// A refusal's RetryAfter is a hint of when a slot frees, learnt from how
// long slots were held: for work of a fraction of a second under a
// 30-second lease, well under the lease, and never past the first held
// lease's end.
func TestSemaphoreRetryAfterHint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const ttl, work = 30 * time.Second, 200 * time.Millisecond
	sem := newSemaphore(t, testdb.Pool(t), pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1, TTL: ttl})
	first, err := sem.Acquire(ctx, "k")
	if err != nil || !first.Acquired {
		t.Fatalf("Acquire: %+v, %v", first, err)
	}
	// Before any release, nothing is known but the lease.
	if s, err := sem.Acquire(ctx, "k"); err != nil || s.Acquired || s.RetryAfter <= ttl-5*time.Second || s.RetryAfter > ttl {
		t.Fatalf("refusal before any release: %+v, %v; want the lease's end, about %s", s, err, ttl)
	}
	for range 3 {
		time.Sleep(work)
		if err := sem.Release(ctx, first); err != nil {
			t.Fatal(err)
		}
		if first, err = sem.Acquire(ctx, "k"); err != nil || !first.Acquired {
			t.Fatalf("Acquire: %+v, %v", first, err)
		}
	}
	s, err := sem.Acquire(ctx, "k")
	if err != nil || s.Acquired {
		t.Fatalf("Acquire while the slot is held: %+v, %v; want refused", s, err)
	}
	if s.RetryAfter < work || s.RetryAfter > 2*time.Second {
		t.Fatalf("RetryAfter %s after holds of %s under a %s lease; want about the holds", s.RetryAfter, work, ttl)
	}
	if hold := sem.HoldTime(); hold < work || hold > 2*time.Second {
		t.Fatalf("HoldTime %s after holds of %s", hold, work)
	}
}

// A slot AcquireTx took is released in the same transaction with
// ReleaseTx: once the transaction commits, the slot is free, and it was
// held while the transaction ran. Release, on the semaphore's own pool,
// cannot see the slot before the commit: it reports ErrSlotLost and frees
// nothing, and the slot is released after the commit.
func TestSemaphoreReleaseTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 1, TTL: time.Second})
	for _, reuse := range []bool{false, true} { // a new slot row, then the row of an ended lease
		if reuse {
			o, err := sem.Acquire(ctx, "k")
			if err != nil || !o.Acquired {
				t.Fatalf("Acquire: %+v, %v", o, err)
			}
			time.Sleep(o.ExpiresIn + 50*time.Millisecond)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		s, err := sem.AcquireTx(ctx, tx, "k")
		if err != nil || !s.Acquired {
			t.Fatalf("AcquireTx (reuse %t): %+v, %v", reuse, s, err)
		}
		if o, err := sem.Acquire(ctx, "k"); err != nil || o.Acquired {
			t.Fatalf("Acquire while the transaction holds the slot: %+v, %v; want refused", o, err)
		}
		if err := sem.ReleaseTx(ctx, tx, s); err != nil {
			t.Fatalf("ReleaseTx: %v", err)
		}
		if o, err := sem.Acquire(ctx, "k"); err != nil || o.Acquired {
			t.Fatalf("Acquire after ReleaseTx, before the commit: %+v, %v; want refused", o, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		o, err := sem.Acquire(ctx, "k")
		if err != nil || !o.Acquired {
			t.Fatalf("Acquire after the commit: %+v, %v; want the slot ReleaseTx freed", o, err)
		}
		if err := sem.Release(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	s, err := sem.AcquireTx(ctx, tx, "k")
	if err != nil || !s.Acquired {
		t.Fatalf("AcquireTx: %+v, %v", s, err)
	}
	if err := sem.Release(ctx, s); !errors.Is(err, pglimitsem.ErrSlotLost) {
		t.Fatalf("Release before the commit: %v, want ErrSlotLost", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sem.Release(ctx, s); err != nil {
		t.Fatalf("Release after the commit: %v", err)
	}
	if n := heldSlots(t, pool, schema, "k"); n != 0 {
		t.Fatalf("%d slots held after the release", n)
	}
}

// Hold keeps a slot past its TTL while the work runs, and its release
// returns the slot; a slot lost meanwhile is reported to failed, and Hold
// stops extending it.
func TestSemaphoreHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	const ttl = time.Second
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 1, TTL: ttl})
	slot, err := sem.Acquire(ctx, "k")
	if err != nil || !slot.Acquired {
		t.Fatalf("Acquire: %+v, %v", slot, err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	var failures []error
	var mu sync.Mutex
	release := sem.Hold(cancelled, slot, func(err error) {
		mu.Lock()
		failures = append(failures, err)
		mu.Unlock()
	})
	cancel() // the caller gave up: the slot is still held, then returned
	time.Sleep(5 * ttl / 2)
	if s, err := sem.Acquire(ctx, "k"); err != nil || s.Acquired {
		t.Fatalf("Acquire while a slot is held for 2.5 TTLs: %+v, %v; want it refused", s, err)
	}
	release()
	if s, err := sem.Acquire(ctx, "k"); err != nil || !s.Acquired {
		t.Fatalf("Acquire after the release: %+v, %v; want the slot", s, err)
	} else if err := sem.Release(ctx, s); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(failures) > 0 {
		t.Errorf("failures while held: %v", failures)
	}
	mu.Unlock()

	// A slot whose row is gone is lost: Hold says so and stops.
	slot, err = sem.Acquire(ctx, "lost")
	if err != nil || !slot.Acquired {
		t.Fatalf("Acquire: %+v, %v", slot, err)
	}
	lost := make(chan error, 4)
	release = sem.Hold(ctx, slot, func(err error) { lost <- err })
	if _, err := pool.Exec(ctx, fmt.Sprintf("DELETE FROM %s WHERE key = 'lost'", pgx.Identifier{schema, "pglimit_slots"}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-lost:
		if !errors.Is(err, pglimitsem.ErrSlotLost) {
			t.Fatalf("the first failure: %v, want ErrSlotLost", err)
		}
	case <-time.After(5 * ttl):
		t.Fatal("no failure reported for a lost slot")
	}
	release()
	if err := <-lost; !errors.Is(err, pglimitsem.ErrSlotLost) {
		t.Fatalf("the release of a lost slot: %v, want ErrSlotLost", err)
	}
	select {
	case err := <-lost:
		t.Fatalf("a failure after the release: %v", err)
	default:
	}
}
