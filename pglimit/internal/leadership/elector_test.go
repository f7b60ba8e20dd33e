package leadership_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/internal/leadership"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// newLeader starts an elector on a key of its own and waits until it leads.
func newLeader(t *testing.T) *leadership.Elector {
	t.Helper()
	pool := testdb.Pool(t)
	leader := make(chan struct{}, 1)
	e := leadership.New(leadership.Config{
		Acquire: func(ctx context.Context) (*pgx.Conn, error) {
			c, err := pool.Acquire(ctx)
			if err != nil {
				return nil, err
			}
			return c.Hijack(), nil
		},
		Key:      time.Now().UnixNano(),
		Interval: 20 * time.Millisecond,
		Logger:   slog.New(slog.NewTextHandler(t.Output(), nil)),
		OnChange: func(l bool) {
			if l {
				select {
				case leader <- struct{}{}:
				default:
				}
			}
		},
	})
	e.Start()
	t.Cleanup(func() { e.Stop(context.Background()) })
	select {
	case <-leader:
	case <-time.After(30 * time.Second):
		t.Fatal("the elector never led")
	}
	return e
}

// Waiting for the leader's connection, which something else is using (a
// batch, or an election ping stuck on a stalled backend), ends with the
// waiter's context.
func TestDoWaitEndsWithContext(t *testing.T) {
	t.Parallel()
	e := newLeader(t)
	inUse, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- e.Do(context.Background(), func(context.Context, *pgx.Conn) error {
			close(inUse)
			<-release
			return nil
		})
	}()
	<-inUse
	// Free the connection after a while in any case, so that a Do that
	// waits regardless of its context fails the test instead of hanging it.
	backstop := time.AfterFunc(5*time.Second, func() { close(release) })

	const wait = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	called := false
	err := e.Do(ctx, func(context.Context, *pgx.Conn) error { called = true; return nil })
	took := time.Since(start)
	if backstop.Stop() {
		close(release)
	}
	if !errors.Is(err, context.DeadlineExceeded) || called {
		t.Errorf("Do while the connection is in use: %v (fn called: %v), want context.DeadlineExceeded without calling fn", err, called)
	}
	if took > wait+500*time.Millisecond {
		t.Errorf("Do returned %s after a context of %s", took, wait)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// The connection is free again for the next caller.
	if err := e.Do(context.Background(), func(ctx context.Context, c *pgx.Conn) error { return c.Ping(ctx) }); err != nil {
		t.Fatalf("Do after the wait: %v", err)
	}
}
