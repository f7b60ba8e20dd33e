package pglimitsem_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// listenTest is a Config.Listen as pool's connections, under
// application_name name, so that the test finds its session in
// pg_stat_activity; it counts its dials, and fails them while refuse is
// set.
type listenTest struct {
	pool   *pgxpool.Pool
	name   string
	dials  atomic.Int32
	refuse atomic.Bool
}

func (l *listenTest) config() *pgx.ConnConfig {
	cfg := l.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = l.name
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		l.dials.Add(1)
		if l.refuse.Load() {
			return nil, errors.New("the test refuses the dial")
		}
		return dial(ctx, network, addr)
	}
	return cfg
}

// listeners are the backends of l's connections that listen.
func (l *listenTest) listeners(t testing.TB) []int32 {
	t.Helper()
	rows, err := l.pool.Query(context.Background(),
		"SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %' AND state = 'idle' ORDER BY pid", l.name)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// listening waits until l has one listener, other than the backend not,
// and returns it. Having listened, the semaphore wakes its waiters to try
// once more (releases went unheard until then); the pause lets that try
// end, so that only a notification can wake them after it. A pause too
// short lets a test pass that should fail, never the other way.
func (l *listenTest) listening(t testing.TB, not int32) int32 {
	t.Helper()
	var pid int32
	waitFor(t, "a listener", func() bool {
		pids := l.listeners(t)
		if len(pids) == 1 && pids[0] != not {
			pid = pids[0]
			return true
		}
		return false
	})
	time.Sleep(200 * time.Millisecond)
	return pid
}

// waitAsync runs sem.Wait(key) and sends when it held the slot.
func waitAsync(t *testing.T, sem *pglimitsem.Semaphore, key string) <-chan time.Time {
	got := make(chan time.Time, 1)
	go func() {
		slot, err := sem.Wait(context.Background(), key)
		if err != nil || !slot.Acquired {
			t.Errorf("Wait: %+v, %v", slot, err)
		}
		got <- time.Now()
	}()
	return got
}

// heardWithin is how soon after a release a listening waiter of another
// instance must hold the slot in these tests: far past a notification's
// few milliseconds on a loaded machine, far short of their WaitPoll.
const heardWithin = 2 * time.Second

// A waiter of another instance holds a released slot as soon as the
// release's notification reaches its listener, long before its poll
// (WaitPoll 10s): the release runs through a transaction-pooling
// PgBouncer, the listener on a connection to the server itself, and the
// namespace and key are of the longest, the key not ASCII, as channel
// and tag bound them.
func TestWaitHearsOtherInstance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	l := &listenTest{pool: pool, name: "pglimitsem-hears"}
	ns := strings.Repeat("n", pglimit.MaxKeyLength)
	key := strings.Repeat("ключ", pglimit.MaxKeyLength/len("ключ"))
	cfg := pglimitsem.Config{Schema: testdb.Schema(t), Namespace: ns, Slots: 1, TTL: time.Minute, WaitPoll: 10 * time.Second, Listen: l.config()}
	holder := newSemaphore(t, testdb.PgBouncerPool(t), cfg)
	waiter := newSemaphore(t, pool, cfg)
	held, err := holder.Acquire(ctx, key)
	if err != nil || !held.Acquired {
		t.Fatalf("Acquire: %+v, %v", held, err)
	}
	got := waitAsync(t, waiter, key)
	waitFor(t, "the waiter's place", func() bool { return waiters(t, pool, cfg.Schema, key) == 1 })
	l.listening(t, 0)
	released := time.Now()
	if err := holder.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		t.Logf("held the slot %s after the release", at.Sub(released))
	case <-time.After(heardWithin):
		t.Fatalf("the waiter of another instance did not hold the released slot within %s (WaitPoll %s)", heardWithin, cfg.WaitPoll)
	}
}

// When the listener's connection is lost and no new one can be dialled,
// waiters poll: a waiter of another instance still holds a released slot
// (WaitPoll 200ms), and the listener keeps trying to dial, pausing
// between tries.
func TestWaitListenerLostPolls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	l := &listenTest{pool: pool, name: "pglimitsem-lost"}
	cfg := pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1, TTL: time.Minute, WaitPoll: 200 * time.Millisecond, Listen: l.config()}
	holder := newSemaphore(t, pool, cfg)
	waiter := newSemaphore(t, testdb.Pool(t), cfg)
	held, err := holder.Acquire(ctx, "k")
	if err != nil || !held.Acquired {
		t.Fatalf("Acquire: %+v, %v", held, err)
	}
	got := waitAsync(t, waiter, "k")
	pid := l.listening(t, 0)
	l.refuse.Store(true)
	lost := time.Now()
	terminate(t, pool, pid)
	waitFor(t, "two dials refused", func() bool { return l.dials.Load() >= 3 })
	if err := holder.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("with its listener lost, the waiter did not hold the released slot within 10s (WaitPoll 200ms)")
	}
	// The pause before a dial is 50ms and doubles: by e after the loss,
	// at most log2(e/50ms + 1) dials, and one more for a slow dial, after
	// the first; dialling every poll (200ms) would be e/200ms.
	time.Sleep(time.Until(lost.Add(3 * time.Second)))
	e := time.Since(lost)
	if d, most := int(l.dials.Load()), 2+int(math.Log2(float64(e/(50*time.Millisecond))+1)); d > most {
		t.Errorf("%d dials %s after losing the listener, want at most %d (a pause of 50ms, doubling)", d, e, most)
	}
}

// A listener whose backend is terminated dials again, and a waiter of
// another instance then hears releases again, long before its poll.
func TestWaitListenerReconnects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	l := &listenTest{pool: pool, name: "pglimitsem-reconnects"}
	cfg := pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1, TTL: time.Minute, WaitPoll: 10 * time.Second, Listen: l.config()}
	holder := newSemaphore(t, pool, cfg)
	waiter := newSemaphore(t, testdb.Pool(t), cfg)
	held, err := holder.Acquire(ctx, "k")
	if err != nil || !held.Acquired {
		t.Fatalf("Acquire: %+v, %v", held, err)
	}
	got := waitAsync(t, waiter, "k")
	first := l.listening(t, 0)
	terminate(t, pool, first)
	l.listening(t, first)
	released := time.Now()
	if err := holder.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		t.Logf("held the slot %s after the release, heard on the second connection", at.Sub(released))
	case <-time.After(heardWithin):
		t.Fatalf("after the listener reconnected, the waiter did not hold the released slot within %s (WaitPoll %s)", heardWithin, cfg.WaitPoll)
	}
}

// Close closes the listener's connection and stops its goroutine (which
// TestMain's leak check would report); it may be called twice, and Wait
// still works after it, polling.
func TestSemaphoreCloseStopsListener(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	l := &listenTest{pool: pool, name: "pglimitsem-close"}
	sem, err := pglimitsem.New(pool, &pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1, WaitPoll: 10 * time.Millisecond, Listen: l.config()})
	if err != nil {
		t.Fatal(err)
	}
	if n := l.dials.Load(); n != 0 {
		t.Fatalf("%d dials before the first Wait, want none", n)
	}
	slot, err := sem.Wait(ctx, "k")
	if err != nil || !slot.Acquired {
		t.Fatalf("Wait: %+v, %v", slot, err)
	}
	l.listening(t, 0)
	closing := time.Now()
	sem.Close()
	t.Logf("Close took %s", time.Since(closing))
	sem.Close()
	// The backend ends once it reads the connection's end.
	waitFor(t, "the listener's backend to end after Close", func() bool { return len(l.listeners(t)) == 0 })
	if err := sem.Release(ctx, slot); err != nil {
		t.Fatal(err)
	}
	if slot, err := sem.Wait(ctx, "k"); err != nil || !slot.Acquired {
		t.Fatalf("Wait after Close: %+v, %v", slot, err)
	}
	if n := l.dials.Load(); n != 1 {
		t.Errorf("%d dials, want 1: none after Close", n)
	}
}

// terminate ends backend pid.
func terminate(t *testing.T, pool *pgxpool.Pool, pid int32) {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
		t.Fatal(fmt.Errorf("terminate backend %d: %v, %w", pid, ok, err))
	}
}
