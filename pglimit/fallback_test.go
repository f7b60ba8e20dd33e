package pglimit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fallbackConfig is a limiter of a generous database limit whose fallback
// allows 5 per key.
func fallbackConfig(schema string, logs *syncBuffer) pglimit.Config {
	return pglimit.Config{
		Schema:  schema,
		Limits:  []pglimit.Limit{{Name: "shared", Rate: 1, Period: time.Hour, Burst: 100}},
		Timeout: 300 * time.Millisecond,
		Fallback: &pglimit.Fallback{
			Limits: []pglimit.Limit{{Name: "local", Rate: 1, Period: time.Hour, Burst: 5}},
			Retry:  100 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(logs, nil)),
		},
	}
}

// waitForDatabase calls Allow on fresh keys until the database decides one.
func waitForDatabase(t *testing.T, lim pglimit.Limiter) {
	t.Helper()
	for i, deadline := 0, time.Now().Add(30*time.Second); ; i++ {
		d, err := lim.Allow(context.Background(), fmt.Sprint("probe-", i))
		if err != nil {
			t.Fatalf("Allow while the database comes back: %v; want a decision", err)
		}
		if !d.Fallback {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("still deciding in process 30s after the database came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A database that stops answering (a stalled connection): calls decide in
// process with the fallback's limits, exactly, without each waiting for
// the timeout, and go back to the database once it answers.
func TestFallbackStalledDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	proxy, pcfg := testdb.NewStallProxy(t)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var logs syncBuffer
	lim := newLimiterOn(t, pool, fallbackConfig(testdb.Schema(t), &logs))
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed || d.Fallback {
		t.Fatalf("Allow with the database up: %+v, %v", d, err)
	}

	proxy.Stall()
	const calls = 20
	admitted, waited := 0, 0
	for range calls {
		start := time.Now()
		d, err := lim.Allow(ctx, "k")
		if err != nil || !d.Fallback {
			t.Fatalf("Allow with the database stalled: %+v, %v; want an in-process decision", d, err)
		}
		if d.Allowed {
			admitted++
		} else if d.RetryAfter <= 0 || d.Violated()[0].Name != "local" {
			t.Fatalf("an in-process refusal: %+v, violated %v; want the local limit's wait", d, d.Violated())
		}
		if time.Since(start) >= 250*time.Millisecond {
			waited++
		}
	}
	if admitted != 5 {
		t.Fatalf("%d calls in process: %d admitted, want the fallback's burst, 5", calls, admitted)
	}
	if waited > calls/2 {
		t.Fatalf("%d of %d calls waited for the timeout; only the retries should", waited, calls)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := lim.Allow(done, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Allow with a cancelled context during the fallback: %v, want context.Canceled", err)
	}
	if _, err := lim.Allow(ctx, ""); !errors.Is(err, pglimit.ErrInvalidKey) {
		t.Fatalf("a bad key during the fallback: %v, want ErrInvalidKey", err)
	}

	proxy.Unstall()
	waitForDatabase(t, lim)
	out := logs.String()
	if !strings.Contains(out, "deciding in process") || !strings.Contains(out, "answers again") || !strings.Contains(out, "fallback_decisions=") {
		t.Fatalf("logs: %s\nwant the fallback's start and end, with its count", out)
	}
}

// A server stopped and started again (a crash and recovery): every call
// gets a decision meanwhile, some of them in process, and the database
// decides again afterwards.
func TestFallbackServerRestart(t *testing.T) {
	testdb.Slow(t)
	t.Parallel()
	ctx := context.Background()
	srv := testdb.OwnServer(t)
	pool := testdb.ServerPool(t, srv, 4)
	if err := pglimit.Migrate(ctx, pool, "public"); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	lim := newLimiterOn(t, pool, fallbackConfig("public", &logs))

	restarted := make(chan error, 1)
	go func() { restarted <- srv.Restart(ctx, true) }()
	local := 0
	for i := 0; ; i++ {
		d, err := lim.Allow(ctx, fmt.Sprint("k", i%50))
		if err != nil {
			t.Fatalf("Allow during the restart: %v; want a decision", err)
		}
		if d.Fallback {
			local++
		}
		select {
		case err := <-restarted:
			if err != nil {
				t.Fatal(err)
			}
			if local == 0 {
				t.Fatal("no decision was made in process while the server was down")
			}
			waitForDatabase(t, lim)
			return
		default:
		}
	}
}

// Fallback limits are checked like any other; only GCRA runs in process.
func TestFallbackConfig(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	for name, f := range map[string]*pglimit.Fallback{
		"no limits":     {},
		"a window":      {Limits: []pglimit.Limit{{Rate: 10, Period: time.Minute, Algorithm: pglimit.FixedWindow}}},
		"a bad limit":   {Limits: []pglimit.Limit{{Rate: 0, Period: time.Minute}}},
		"negative keys": {Limits: []pglimit.Limit{{Rate: 1, Period: time.Minute}}, MaxKeys: -1},
	} {
		_, err := pglimit.New(pool, &pglimit.Config{Cooldown: time.Minute, Fallback: f})
		if !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// During a fallback, a cost the in-process limits can never admit at once
// is ErrInvalidCost, as a cost beyond the database's limits is, not a
// refusal whose RetryAfter never comes.
func TestFallbackCostBeyondBurst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there: every connection is refused
	pool, err := pgxpool.New(ctx, "postgres://pglimit@"+addr+"/pglimit?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var logs syncBuffer
	lim := newLimiterOn(t, pool, fallbackConfig("public", &logs))
	if d, err := lim.AllowN(ctx, "k", 10); !errors.Is(err, pglimit.ErrInvalidCost) {
		t.Errorf("AllowN(10) in process, against a fallback burst of 5: %+v, %v; want ErrInvalidCost", d, err)
	}
	if d, err := lim.AllowN(ctx, "k", 5); err != nil || !d.Allowed || !d.Fallback {
		t.Errorf("AllowN(5) in process: %+v, %v; want admitted by the fallback", d, err)
	}
}

// A key whose row a long transaction holds is no outage: while the
// database decides the other keys, the held key's call that times out is
// decided in process, alone, and no fallback starts for the others.
//
// A call on another key that itself runs past Timeout, with no other
// answer meanwhile, is what an outage looks like, and rightly starts a
// fallback. A loaded machine can make one do so, and that attempt then
// proves nothing: it is made again with a Timeout four times as long.
func TestFallbackLockedKeyIsNoOutage(t *testing.T) {
	t.Parallel()
	pool := bigPool(t, 8)
	schema := testdb.Schema(t)
	timeout := 300 * time.Millisecond
	for attempt := range 3 {
		local, others, slowest, log := lockedKeyAttempt(t, pool, schema, fmt.Sprint("held-", attempt), timeout)
		if slowest >= timeout {
			t.Logf("attempt %d: a call on another key took %s, past its Timeout of %s: again with %s", attempt, slowest, timeout, 4*timeout)
			timeout *= 4
			continue
		}
		if local > 0 || strings.Contains(log, "unavailable") {
			t.Errorf("%d of %d decisions on other keys were made in process, the slowest in %s; log: %s", local, others, slowest, log)
		}
		return
	}
	t.Fatalf("in each of 3 attempts, up to a Timeout of %s, a call on another key ran past Timeout: the machine is too loaded to tell a held row from an outage", timeout/4)
}

// lockedKeyAttempt holds held's row while a limiter with timeout decides
// other keys every 5 ms and held three times. It returns how many of the
// other keys' decisions were made in process, of how many, the slowest
// of those calls, and the fallback's log.
func lockedKeyAttempt(t *testing.T, pool *pgxpool.Pool, schema, held string, timeout time.Duration) (local, others int, slowest time.Duration, log string) {
	t.Helper()
	var logs syncBuffer
	cfg := fallbackConfig(schema, &logs)
	cfg.Timeout = timeout
	lim := newLimiterOn(t, pool, cfg)
	if d, err := lim.Allow(t.Context(), held); err != nil || !d.Allowed || d.Fallback {
		t.Fatalf("the first Allow: %+v, %v", d, err)
	}
	release := lockKeys(t, pool, schema, "pglimit_upsert", held)
	defer release()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			began := time.Now()
			d, err := lim.Allow(t.Context(), fmt.Sprint(held, "-other-", i))
			slowest = max(slowest, time.Since(began))
			if err != nil {
				t.Error(err)
				return
			}
			others++
			if d.Fallback {
				local++
			}
		}
	})
	for range 3 {
		d, err := lim.Allow(t.Context(), held)
		if err != nil || !d.Fallback {
			t.Errorf("Allow on the held key past Timeout: %+v, %v; want a decision made in process", d, err)
		}
	}
	close(stop)
	wg.Wait()
	return local, others, slowest, logs.String()
}

// A key whose row another transaction holds past the server's
// lock_timeout: the server answered, so it is no outage. The call is
// decided in process, no fallback starts for the other keys, and the log
// says that a row was locked, not that the database is unavailable.
func TestFallbackServerLockTimeout(t *testing.T) {
	t.Parallel()
	pcfg := bigPoolConfig(t, 4)
	pcfg.ConnConfig.RuntimeParams["lock_timeout"] = "100ms"
	pool := openPool(t, pcfg)
	var logs syncBuffer
	schema := testdb.Schema(t)
	cfg := fallbackConfig(schema, &logs)
	cfg.Timeout = 5 * time.Second  // the server's lock_timeout comes first
	cfg.Fallback.Retry = time.Hour // a fallback, once started, would hold every key
	lim := newLimiterOn(t, pool, cfg)
	if d, err := lim.Allow(t.Context(), "held"); err != nil || !d.Allowed || d.Fallback {
		t.Fatalf("the first Allow: %+v, %v", d, err)
	}
	lockKeys(t, pool, schema, "pglimit_upsert", "held")
	if d, err := lim.Allow(t.Context(), "held"); err != nil || !d.Fallback {
		t.Fatalf("Allow on the held key past lock_timeout: %+v, %v; want a decision made in process", d, err)
	}
	if d, err := lim.Allow(t.Context(), "other"); err != nil || d.Fallback {
		t.Errorf("Allow on another key right after: %+v, %v; want the database's decision", d, err)
	}
	if out := logs.String(); strings.Contains(out, "unavailable") || !strings.Contains(out, "lock_timeout") {
		t.Errorf("the log says %q; want a row locked past lock_timeout, not the database unavailable", out)
	}
}
