package pglimit_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// Waiters of two instances are all served, in turn, at the limit's rate:
// the k-th to return returns no sooner than (k-1) emission intervals
// after the first decision.
func TestWaitServesInTurn(t *testing.T) {
	t.Parallel()
	const T = 50 * time.Millisecond
	cfg := pglimit.Config{Schema: testdb.Schema(t), Namespace: "wait", Limits: []pglimit.Limit{{Name: "rate", Rate: 20, Period: time.Second, Burst: 1}}}
	a, b := newLimiterOn(t, testdb.Pool(t), cfg), newLimiterOn(t, testdb.Pool(t), cfg)

	const waiters = 8
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	var (
		mu   sync.Mutex
		back []time.Duration
		wg   sync.WaitGroup
	)
	for i := range waiters {
		lim := []pglimit.Limiter{a, b}[i%2]
		wg.Go(func() {
			d, err := pglimit.Wait(ctx, lim, "job")
			if err != nil || !d.Allowed {
				t.Errorf("Wait: %+v, %v", d, err)
			}
			mu.Lock()
			back = append(back, time.Since(start))
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(back)
	for k, at := range back {
		if at < time.Duration(k)*T {
			t.Errorf("waiter %d of %d returned %s after the start, before its turn at %s: %s", k+1, waiters, at, time.Duration(k)*T, back)
		}
	}
}

// A wait longer than the context allows consumes nothing; a waiter that
// gives up gives its units back when no one reserved after it.
func TestWaitGivesUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	cfg := pglimit.Config{Schema: testdb.Schema(t), Namespace: "give-up", Limits: []pglimit.Limit{{Name: "rate", Rate: 1, Period: time.Second, Burst: 1}}}
	lim := newLimiterOn(t, pool, cfg)
	resetIn := func() time.Duration {
		t.Helper()
		st, err := pglimit.Inspect(ctx, lim, "k")
		if err != nil {
			t.Fatal(err)
		}
		return st.Limits[0].ResetAfter
	}

	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("Allow: %+v, %v", d, err)
	}
	before := resetIn() // about 1 s: the next unit is a second away

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	d, err := pglimit.Wait(short, lim, "k")
	if !errors.Is(err, context.DeadlineExceeded) || d.Allowed {
		t.Fatalf("Wait with 300 ms for a unit a second away: %+v, %v; want DeadlineExceeded at once", d, err)
	}
	if after := resetIn(); after > before {
		t.Fatalf("after a wait refused: the key is full in %s, was %s; it consumed units", after, before)
	}

	giveUp, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	reserved := &reserveSeen{Limiter: lim, done: make(chan struct{}, 1)}
	go func() {
		_, err := pglimit.Wait(giveUp, reserved, "k")
		done <- err
	}()
	// The waiter waits out its reservation once Reserve has returned: the
	// key's state alone shows the reservation before its answer is back,
	// and a cancel then cuts off the statement, which leaves the units
	// spent (they are given back only by a Refund of the decision).
	<-reserved.done
	if after := resetIn(); after < before {
		t.Fatalf("the waiter reserved, yet the key is full in %s, was %s", after, before)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a waiter that gives up: %v, want context.Canceled", err)
	}
	if after := resetIn(); after > before {
		t.Errorf("after the waiter gave up: the key is full in %s, was %s; its unit was not given back", after, before)
	}

	if _, err := pglimit.WaitN(ctx, lim, "k", 2); !errors.Is(err, pglimit.ErrInvalidCost) {
		t.Errorf("WaitN past the burst: %v, want ErrInvalidCost", err)
	}
	window := pglimit.Config{Schema: cfg.Schema, Namespace: "window", Limits: []pglimit.Limit{{Rate: 5, Period: time.Minute, Algorithm: pglimit.FixedWindow}}}
	if _, err := pglimit.Wait(ctx, newLimiterOn(t, pool, window), "k"); !errors.Is(err, pglimit.ErrUnsupported) {
		t.Errorf("Wait on a window: %v, want ErrUnsupported", err)
	}
}

// A waiter whose context ends while its reservation's statement is in
// flight (a long transaction holds the key's row) returns the context's
// cause, as one whose context ends during the wait does: the driver's
// error for the cut-off statement says only "context deadline exceeded".
func TestWaitCutOffReturnsCause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	cfg := pglimit.Config{Schema: testdb.Schema(t), Timeout: 10 * time.Second, Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 100}}}
	lim := newLimiterOn(t, pool, cfg)
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("Allow: %+v, %v", d, err)
	}
	lockKeys(t, pool, cfg.Schema, "pglimit_upsert", "k")
	gone := errors.New("the client went away")
	short, cancel := context.WithTimeoutCause(ctx, 200*time.Millisecond, gone)
	defer cancel()
	start := time.Now()
	d, err := pglimit.Wait(short, lim, "k")
	if took := time.Since(start); !errors.Is(err, gone) || !errors.Is(err, context.DeadlineExceeded) || d.Allowed || took > 200*time.Millisecond+deadlineSlack {
		t.Fatalf("Wait cut off in its reservation: %+v, %v after %s; want the context's cause within %s", d, err, took, deadlineSlack)
	}
}

// reserveSeen is a Limiter that signals each return of Reserve.
type reserveSeen struct {
	pglimit.Limiter
	done chan struct{}
}

func (r *reserveSeen) Reserve(ctx context.Context, key string, n int, maxDelay time.Duration) (pglimit.Decision, error) {
	d, err := r.Limiter.Reserve(ctx, key, n, maxDelay)
	r.done <- struct{}{}
	return d, err
}

// A refusal of WaitAtMost says when the same call, with the same
// maxDelay, is admitted: the units' wait less maxDelay, not the wait
// itself. On a stopped clock the figures are exact.
func TestWaitAtMostRetryAfter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := pglimittest.NewClock(t)
	cfg := pglimit.Config{Schema: testdb.Schema(t), Namespace: "at-most", Limits: []pglimit.Limit{{Name: "rate", Rate: 10, Period: time.Second, Burst: 1}}}
	lim := newLimiterOn(t, clock.Pool(t), cfg)
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("Allow: %+v, %v", d, err)
	}
	// The next unit is 100 ms away.
	const maxDelay = 50 * time.Millisecond
	d, err := pglimit.WaitAtMost(ctx, lim, "k", 1, maxDelay)
	if err != nil || d.Allowed || d.RetryAfter != 100*time.Millisecond-maxDelay {
		t.Fatalf("WaitAtMost(50ms) for a unit 100ms away: %+v, %v; want refused with RetryAfter 50ms", d, err)
	}
	clock.Advance(d.RetryAfter)
	if d, err := pglimit.WaitAtMost(ctx, lim, "k", 1, maxDelay); err != nil || !d.Allowed || d.Delay != maxDelay {
		t.Fatalf("the same call RetryAfter later: %+v, %v; want admitted after a Delay of 50ms", d, err)
	}
}
