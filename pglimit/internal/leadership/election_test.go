package leadership_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/internal/leadership"
)

// pollTimeout bounds every wait for the election to settle. It is far
// above what any wait takes, so that a loaded machine does not fail the
// suite; the tests assert what happens, never how fast.
const pollTimeout = 30 * time.Second

// interval is the election interval of the tests' electors.
const interval = 20 * time.Millisecond

var lastKey atomic.Int64

// newKey returns an advisory lock key no other test uses: the tests share
// one database.
func newKey() int64 {
	for {
		old := lastKey.Load()
		k := max(old+1, time.Now().UnixNano())
		if lastKey.CompareAndSwap(old, k) {
			return k
		}
	}
}

// contender is one process taking part in an election.
type contender struct {
	*leadership.Elector
	mu      sync.Mutex
	changes []bool // every leadership change OnChange reported
}

// reported returns the leadership changes OnChange reported.
func (c *contender) reported() []bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]bool(nil), c.changes...)
}

// lost reports whether the contender reported losing leadership.
func (c *contender) lost() bool { return slices.Contains(c.reported(), false) }

// election is n electors on one key, each with a pool of its own, as
// separate application instances would run them.
type election struct {
	key        int64
	admin      *pgxpool.Pool
	contenders []*contender
}

func newElection(t *testing.T, n int) *election {
	t.Helper()
	el := &election{key: newKey(), admin: testdb.Pool(t)}
	for range n {
		el.add(t, interval)
	}
	return el
}

// add starts one more contender, with its own pool and election interval
// every, stopped when the test ends.
func (el *election) add(t *testing.T, every time.Duration) *contender {
	t.Helper()
	pool := testdb.Pool(t)
	c := &contender{}
	c.Elector = leadership.New(leadership.Config{
		Acquire: func(ctx context.Context) (*pgx.Conn, error) {
			pc, err := pool.Acquire(ctx)
			if err != nil {
				return nil, err
			}
			return pc.Hijack(), nil
		},
		Key:      el.key,
		Interval: every,
		Logger:   slog.New(slog.NewTextHandler(t.Output(), nil)).With("contender", len(el.contenders)),
		OnChange: func(leader bool) {
			c.mu.Lock()
			c.changes = append(c.changes, leader)
			c.mu.Unlock()
		},
	})
	c.Start()
	t.Cleanup(func() { c.Stop(context.Background()) })
	el.contenders = append(el.contenders, c)
	return c
}

// leaders returns the contenders that report leadership.
func (el *election) leaders() []int {
	var out []int
	for i, c := range el.contenders {
		if c.Leader() {
			out = append(out, i)
		}
	}
	return out
}

// holders returns the backends that hold the election's lock.
func (el *election) holders(t *testing.T) []int32 {
	t.Helper()
	rows, err := el.admin.Query(t.Context(), `
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND (classid::bigint << 32 | objid::bigint) = $1`, el.key)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// pid returns the backend of contender i's connection, through Do, so
// only while it leads.
func (el *election) pid(ctx context.Context, i int) (int32, error) {
	var pid int32
	err := el.contenders[i].Do(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
	})
	return pid, err
}

// settled waits until exactly one contender reports leadership, one
// backend holds the lock and it is that contender's, and returns the
// leader and its backend. Contenders in skip are expected not to lead.
func (el *election) settled(t *testing.T, what string, skip ...int) (leader int, pid int32) {
	t.Helper()
	var last string
	deadline := time.Now().Add(pollTimeout)
	for ; time.Now().Before(deadline); time.Sleep(interval) {
		l, h := el.leaders(), el.holders(t)
		last = fmt.Sprintf("contenders %v report leadership, backends %v hold the lock", l, h)
		if len(l) != 1 || len(h) != 1 {
			continue
		}
		for _, s := range skip {
			if l[0] == s {
				t.Fatalf("%s: contender %d leads", what, s)
			}
		}
		p, err := el.pid(t.Context(), l[0])
		if err == nil && p == h[0] {
			return l[0], p
		}
		last += fmt.Sprintf("; the leader's backend is %d (%v)", p, err)
	}
	t.Fatalf("%s: not settled after %s: %s", what, pollTimeout, last)
	return 0, 0
}

// Among N contenders exactly one leads, on the backend that holds the
// lock, and stays leader while nothing fails; the others are refused Do.
func TestOneLeaderAmongN(t *testing.T) {
	t.Parallel()
	const n = 4
	el := newElection(t, n)
	leader, pid := el.settled(t, "first election")

	// Every follower has asked for the lock several times since.
	for range 10 * n {
		if l := el.leaders(); len(l) != 1 || l[0] != leader {
			t.Fatalf("contenders %v report leadership, want only %d", l, leader)
		}
		if h := el.holders(t); len(h) != 1 || h[0] != pid {
			t.Fatalf("backends %v hold the lock, want only the leader's %d", h, pid)
		}
		time.Sleep(interval)
	}
	for i, c := range el.contenders {
		if i == leader {
			if err := c.IsLeader(t.Context()); err != nil {
				t.Errorf("leader %d: IsLeader = %v", i, err)
			}
			continue
		}
		if err := c.IsLeader(t.Context()); !errors.Is(err, leadership.ErrNotLeader) {
			t.Errorf("follower %d: IsLeader = %v, want ErrNotLeader", i, err)
		}
		called := false
		err := c.Do(t.Context(), func(context.Context, *pgx.Conn) error { called = true; return nil })
		if !errors.Is(err, leadership.ErrNotLeader) || called {
			t.Errorf("follower %d: Do = %v (fn called: %t), want ErrNotLeader without calling fn", i, err, called)
		}
	}
}

// When the server terminates the leader's backend, the lock is free at
// once: the leader finds out and reports the loss, and one contender leads
// on another backend (the old leader itself may win again, on a new
// connection).
func TestTakeoverAfterTerminate(t *testing.T) {
	t.Parallel()
	el := newElection(t, 3)
	old, oldPID := el.settled(t, "first election")

	var ok bool
	if err := el.admin.QueryRow(t.Context(), "SELECT pg_terminate_backend($1)", oldPID).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %t, %v", oldPID, ok, err)
	}
	waitFor(t, "the old leader to report the loss", el.contenders[old].lost)
	leader, pid := el.settled(t, "after pg_terminate_backend")
	if pid == oldPID {
		t.Fatalf("contender %d leads on the terminated backend %d", leader, pid)
	}
	t.Logf("contender %d led on backend %d; after terminating it, contender %d leads on %d", old, oldPID, leader, pid)
}

// When the leader's connection dies on the client's side (its process was
// killed, its socket closed), the server ends the session and frees the
// lock; the leader notices at its next ping, and one contender leads on
// another backend.
func TestTakeoverAfterKilledConnection(t *testing.T) {
	t.Parallel()
	el := newElection(t, 3)
	old, oldPID := el.settled(t, "first election")

	err := el.contenders[old].Do(t.Context(), func(_ context.Context, conn *pgx.Conn) error {
		return conn.PgConn().Conn().Close() // under pgx: it learns at its next use
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the old leader to report the loss", el.contenders[old].lost)
	leader, pid := el.settled(t, "after the killed connection")
	if pid == oldPID {
		t.Fatalf("contender %d leads on the killed backend %d", leader, pid)
	}
	t.Logf("contender %d led on backend %d; after its connection was killed, contender %d leads on %d", old, oldPID, leader, pid)
}

// Stop releases the lock: another contender takes over at its next step,
// and the stopped one reports, and is, no leader any more. The leader's
// election interval is long, so that its session's idle_session_timeout
// (leadership.IdleTimeout) is longer than the wait for the takeover: only
// Stop can have freed the lock in time.
func TestStopReleases(t *testing.T) {
	t.Parallel()
	const slow = 10 * time.Second
	if idle := leadership.IdleTimeout(slow); idle <= pollTimeout {
		t.Fatalf("the leader's idle_session_timeout %s would end its session within the wait of %s", idle, pollTimeout)
	}
	el := &election{key: newKey(), admin: testdb.Pool(t)}
	c := el.add(t, slow) // its first step, at once, wins the lock
	el.settled(t, "first election")
	el.add(t, interval)
	el.add(t, interval)

	stopped := time.Now()
	c.Stop(t.Context())
	if c.Leader() || !c.lost() {
		t.Errorf("stopped leader: Leader() = %t, reported changes %v; want the loss reported", c.Leader(), c.reported())
	}
	if err := c.Do(t.Context(), func(context.Context, *pgx.Conn) error { return nil }); !errors.Is(err, leadership.ErrNotLeader) {
		t.Errorf("Do after Stop = %v, want ErrNotLeader", err)
	}
	leader, _ := el.settled(t, "after Stop", 0)
	t.Logf("the leader stopped; contender %d led %s later (election interval %s)", leader, time.Since(stopped).Round(time.Millisecond), interval)

	c.Stop(t.Context()) // twice is fine
	if l := el.leaders(); len(l) != 1 || l[0] != leader {
		t.Errorf("after a second Stop, contenders %v lead, want %d", l, leader)
	}
}

// waitFor polls cond until it holds, or fails the test after pollTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(pollTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting for %s", pollTimeout, what)
		}
		time.Sleep(interval)
	}
}
