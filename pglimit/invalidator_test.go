package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// startInvalidator starts an Invalidator on the test server whose session
// carries name as its application_name, stopped when the test ends.
func startInvalidator(t *testing.T, name string) *pglimit.Invalidator {
	t.Helper()
	cc, err := pgx.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cc.RuntimeParams["application_name"] = name
	inv, err := pglimit.NewInvalidator(&pglimit.InvalidatorConfig{ConnConfig: cc, Heartbeat: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := inv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopInvalidator(t, inv) })
	if !inv.Listening() {
		t.Fatal("Start returned before the invalidator listens")
	}
	return inv
}

func stopInvalidator(t *testing.T, inv *pglimit.Invalidator) {
	t.Helper()
	if err := inv.Stop(context.Background()); err != nil {
		t.Error(err)
	}
}

// waitFor polls cond until it holds, for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// twoInstances returns limiters a and b as two instances of one app would
// have them (their own pools, one schema), b's pre-block following inv.
func twoInstances(t *testing.T, inv *pglimit.Invalidator) (a, b pglimit.Limiter) {
	t.Helper()
	schema := testdb.Schema(t)
	var err error
	if a, err = pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: schema, Cooldown: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if b, err = pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: schema, Cooldown: time.Hour, PreBlockSize: 100, Invalidator: inv}); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// admitAndBlock admits key on b and checks that b's pre-block now refuses
// it.
func admitAndBlock(t *testing.T, b pglimit.Limiter, key string) {
	t.Helper()
	if d, err := b.Allow(t.Context(), key); err != nil || !d.Allowed {
		t.Fatalf("b admits %s: %+v, %v", key, d, err)
	}
	if d, err := b.Allow(t.Context(), key); err != nil || d.Allowed {
		t.Fatalf("b refuses %s: %+v, %v", key, d, err)
	}
	if !pglimit.PreBlocks(b, key) {
		t.Fatalf("b's pre-block does not hold %s", key)
	}
}

// A Reset on one instance lifts another instance's pre-block: without the
// Invalidator, it would refuse for the whole hour of the cooldown. Other
// keys, and other namespaces' keys, stay blocked. The figures are the time
// from Reset's return to the other pre-block letting the key through.
func TestInvalidatorCarriesResets(t *testing.T) {
	t.Parallel()
	inv := startInvalidator(t, "pglimit-test-carries")
	a, b := twoInstances(t, inv)
	admitAndBlock(t, b, "other")

	const resets = 200
	fromCall := make([]time.Duration, 0, resets)
	fromReturn := make([]time.Duration, 0, resets)
	for i := range resets {
		key := fmt.Sprintf("k%d", i%5)
		admitAndBlock(t, b, key)
		called := time.Now()
		if err := a.Reset(t.Context(), key); err != nil {
			t.Fatal(err)
		}
		returned := time.Now()
		// Spin rather than waitFor, whose 1 ms sleeps would be the
		// resolution of the figures.
		for deadline := returned.Add(10 * time.Second); pglimit.PreBlocks(b, key); runtime.Gosched() {
			if time.Now().After(deadline) {
				t.Fatalf("b's pre-block still holds %s 10 s after a Reset", key)
			}
		}
		fromCall, fromReturn = append(fromCall, time.Since(called)), append(fromReturn, time.Since(returned))
	}
	for _, l := range []struct {
		from string
		lat  []time.Duration
	}{{"the call of", fromCall}, {"the return of", fromReturn}} {
		slices.Sort(l.lat)
		t.Logf("from %s Reset on one instance to the other's pre-block forgetting the key, %d resets: p50 %s, p99 %s, max %s",
			l.from, resets, l.lat[resets/2], l.lat[resets*99/100], l.lat[resets-1])
	}
	if !pglimit.PreBlocks(b, "other") {
		t.Fatal("a Reset of other keys lifted the pre-block of key other")
	}
}

// While the listening session is down, the pre-block answers nothing; a
// Reset made meanwhile, whose notification nobody heard, is not ignored
// once it listens again.
func TestInvalidatorFallsBackWhileDown(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const name = "pglimit-test-falls-back"
	inv := startInvalidator(t, name)
	a, b := twoInstances(t, inv)
	admitAndBlock(t, b, "k")

	// End the session from the server side.
	admin := testdb.Pool(t)
	kill := func() {
		t.Helper()
		if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, name); err != nil {
			t.Fatal(err)
		}
	}
	kill()
	waitFor(t, "the invalidator to notice", func() bool { return !inv.Listening() })
	if pglimit.PreBlocks(b, "k") {
		t.Fatal("the pre-block refuses while its invalidator is not listening")
	}
	// Decisions still go to the database, which refuses.
	if d, err := b.Allow(ctx, "k"); err != nil || d.Allowed {
		t.Fatalf("b while not listening: %+v, %v; want refused by the database", d, err)
	}
	if err := a.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the invalidator to listen again", inv.Listening)
	if pglimit.PreBlocks(b, "k") {
		t.Fatal("after reconnecting, the pre-block still refuses a key reset while it was down")
	}
	if d, err := b.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("b after the Reset: %+v, %v; want admitted", d, err)
	}
}

// Stopping the invalidator turns the pre-blocks that follow it off.
func TestInvalidatorStop(t *testing.T) {
	t.Parallel()
	inv := startInvalidator(t, "pglimit-test-stop")
	_, b := twoInstances(t, inv)
	admitAndBlock(t, b, "k")
	stopInvalidator(t, inv)
	if inv.Listening() || pglimit.PreBlocks(b, "k") {
		t.Fatal("the pre-block refuses after its invalidator stopped")
	}
}

func TestInvalidatorConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []*pglimit.InvalidatorConfig{nil, {}, {ConnConfig: &pgx.ConnConfig{}, Heartbeat: -time.Second}} {
		if _, err := pglimit.NewInvalidator(cfg); !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("NewInvalidator(%+v): %v, want ErrInvalidConfig", cfg, err)
		}
	}
	inv := startInvalidator(t, "pglimit-test-config")
	_, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Cooldown: time.Second, Invalidator: inv})
	if !errors.Is(err, pglimit.ErrInvalidConfig) {
		t.Errorf("an Invalidator without a pre-block: %v, want ErrInvalidConfig", err)
	}
}

// Reset notifies in its own transaction: a NOTIFY is delivered only if it
// commits. Checked by a listener of its own.
func TestResetNotifies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "LISTEN pglimit_reset"); err != nil {
		t.Fatal(err)
	}
	lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: testdb.Schema(t), Cooldown: time.Minute, Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	// The channel is every limiter's: tests running beside this one
	// notify on it too, so wait for this test's own key.
	key := "a:b:" + testdb.Schema(t)
	if err := lim.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var seen []string
	for {
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no notification for %q (saw %q): %v", key, seen, err)
		}
		if _, got, ok := strings.Cut(n.Payload, ":"); ok && got == key {
			return
		}
		seen = append(seen, n.Payload)
	}
}

// Start returns once the session listens; with no server to listen on, it
// gives up when its ctx ends, says why, and leaves nothing running
// (testdb.Main checks for goroutines left behind). A second Start fails,
// and so does a Start after Stop.
func TestInvalidatorStart(t *testing.T) {
	t.Parallel()
	cc, err := pgx.ParseConfig("postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := pglimit.NewInvalidator(&pglimit.InvalidatorConfig{ConnConfig: cc, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = inv.Start(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "last failure") {
		t.Fatalf("Start without a server: %v, want an error wrapping context.DeadlineExceeded that names the last failure", err)
	}
	if inv.Listening() {
		t.Fatal("listening without a server")
	}
	if err := inv.Start(context.Background()); err == nil {
		t.Fatal("a second Start succeeded")
	}

	live := startInvalidator(t, "pglimit-test-start")
	if err := live.Start(context.Background()); err == nil {
		t.Fatal("Start on a running invalidator succeeded")
	}
}
