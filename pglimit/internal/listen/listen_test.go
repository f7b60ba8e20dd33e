package listen_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/internal/listen"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// A listener hears what is notified on its channel, and nothing else; it
// is trusted while it listens; after its session is killed it reconnects,
// says so (notifications meanwhile were missed), and hears again; and it
// is not trusted once it stops.
func TestListener(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	cc, err := pgx.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cc.RuntimeParams["application_name"] = "pglimit-test-listen"
	heard := make(chan string, 16)
	var mu sync.Mutex
	starts := 0
	l := listen.New(cc, "pglimit_test_listen", 100*time.Millisecond,
		func(payload string) { heard <- payload },
		func() { mu.Lock(); starts++; mu.Unlock() })
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.Run(runCtx) }()
	select {
	case <-l.First():
	case <-time.After(10 * time.Second):
		t.Fatalf("never listened: %v", l.LastErr())
	}
	if !l.Trusted(time.Now()) {
		t.Fatal("not trusted while listening")
	}

	notify := func(channel, payload string) {
		t.Helper()
		if _, err := pool.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-heard:
			if got != want {
				t.Fatalf("heard %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("did not hear %q", want)
		}
	}
	notify("another_channel", "not for us")
	notify("pglimit_test_listen", "one")
	expect("one")

	if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pglimit-test-listen'"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := starts
		mu.Unlock()
		if n >= 2 && l.Trusted(time.Now()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("listening started %d times, trusted %t: no reconnection", n, l.Trusted(time.Now()))
		}
	}
	notify("pglimit_test_listen", "two")
	expect("two")

	stop()
	<-done
	if l.Trusted(time.Now()) {
		t.Fatal("trusted after Run returned")
	}
}
