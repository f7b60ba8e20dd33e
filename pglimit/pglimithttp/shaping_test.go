package pglimithttp_test

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// shaped is two instances of a service whose middleware holds requests
// (MaxDelay) under one limit on a test clock: nginx's "rate=20r/s
// burst=5", 20 a second with Burst 1, held up to 5 slots of 50 ms.
type shaped struct {
	servers  []*httptest.Server
	lim      pglimit.Limiter // the first instance's
	canceled chan struct{}   // a value for each request whose client left while held, once the middleware is done with it
	refunds  *refunds        // the Refunds both instances' limiters made
}

// refunds is an Observer that keeps what each Refund returned.
type refunds struct {
	mu   sync.Mutex
	errs []error
}

func (r *refunds) StartDecision(ctx context.Context, _ pglimit.Observation) context.Context {
	return ctx
}

func (r *refunds) EndDecision(_ context.Context, o pglimit.Observation) {
	if o.Op == pglimit.OpRefund {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.errs = append(r.errs, o.Err)
	}
}

func (r *refunds) taken() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.errs)
}

const slot = 50 * time.Millisecond

func newShaped(t *testing.T) *shaped {
	t.Helper()
	clock := pglimittest.NewClock(t)
	s := &shaped{canceled: make(chan struct{}, 16), refunds: &refunds{}}
	cfg := pglimit.Config{Schema: pglimittest.Schema(t), Namespace: "shaped", Limits: []pglimit.Limit{{Name: "rps", Rate: 20, Period: time.Second, Burst: 1}},
		Observer: s.refunds}
	onDecision := func(_ *http.Request, ev pglimithttp.Event) {
		if ev.Outcome == pglimithttp.OutcomeCanceled {
			s.canceled <- struct{}{}
		}
	}
	for range 2 {
		lim, err := pglimit.New(clock.Pool(t), &cfg)
		if err != nil {
			t.Fatal(err)
		}
		mw, err := pglimithttp.Middleware(lim, &pglimithttp.Config{KeyFunc: pglimithttp.FromHeader("X-User"), MaxDelay: 5 * slot, OnDecision: onDecision})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, _ := pglimithttp.DecisionFrom(r.Context())
			w.Header().Set("X-Held", d.Delay.String())
		})))
		t.Cleanup(srv.Close)
		s.servers = append(s.servers, srv)
		s.lim = cmp.Or(s.lim, lim)
	}
	return s
}

// call sends a request of user to instance i, and returns its status and
// how long the middleware held it.
func (s *shaped) call(ctx context.Context, i int, user string) (int, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", s.servers[i%len(s.servers)].URL, nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("X-User", user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	resp.Body.Close()
	held, _ := time.ParseDuration(resp.Header.Get("X-Held"))
	return resp.StatusCode, held, nil
}

// Ten requests at once over two instances: one is served at once, five are
// held one slot apart, and four would wait past MaxDelay and are refused.
// The clock stands still, so the slots are exact.
func TestMaxDelayShapes(t *testing.T) {
	t.Parallel()
	s := newShaped(t)
	var (
		mu      sync.Mutex
		held    []time.Duration
		refused int
		wg      sync.WaitGroup
	)
	start := time.Now()
	for i := range 10 {
		wg.Go(func() {
			code, d, err := s.call(context.Background(), i, "alice")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Error(err)
			case code == http.StatusOK:
				held = append(held, d)
				if since := time.Since(start); since < d {
					t.Errorf("a request held %s was answered %s after the start", d, since)
				}
			case code == http.StatusTooManyRequests:
				refused++
			default:
				t.Errorf("status %d", code)
			}
		})
	}
	wg.Wait()
	slices.Sort(held)
	want := []time.Duration{0, slot, 2 * slot, 3 * slot, 4 * slot, 5 * slot}
	if !slices.Equal(held, want) || refused != 4 {
		t.Errorf("10 requests at once: served after %v and %d refused; want %v and 4 refused", held, refused, want)
	}
}

// A held request whose client goes away gives its slot back: the next
// request is held as long as the one that left would have been.
func TestMaxDelayClientGone(t *testing.T) {
	t.Parallel()
	s := newShaped(t)
	ctx := context.Background()
	// Four slots taken at once, without waiting for them: the next
	// request is held four slots (200 ms), on a database clock that does
	// not move.
	for range 4 {
		if d, err := s.lim.Reserve(ctx, "bob", 1, time.Hour); err != nil || !d.Allowed {
			t.Fatalf("Reserve: %+v, %v", d, err)
		}
	}
	// The client leaves once its request is held: its reservation, on the
	// frozen clock, makes the key wait 5 slots until it is given back.
	gone, leave := context.WithCancel(ctx)
	defer leave()
	left := make(chan error, 1)
	go func() {
		_, _, err := s.call(gone, 1, "bob")
		left <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		d, err := s.lim.Peek(ctx, "bob", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.RetryAfter > 4*slot {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after it was sent, the request is not held: the key waits %s", d.RetryAfter)
		}
	}
	leave()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("a client that leaves while held: %v, want its own cancellation", err)
	}
	// The server gives the slot back once it sees its client gone, and
	// then reports the request canceled.
	select {
	case <-s.canceled:
	case <-time.After(5 * time.Second):
		t.Fatal("5 s after the held client left, the server has not reported it canceled")
	}
	// The give-back is one Refund, bounded at 250 ms (WaitN's doc). One
	// that ran out of that time on a loaded machine has an unknown
	// outcome: the slot was given back, or stays spent, which the doc
	// allows, and the next request is then held behind it.
	refunded := s.refunds.taken()
	if len(refunded) != 1 {
		t.Fatalf("the held client's leaving made %d Refunds, want 1: %v", len(refunded), refunded)
	}
	want := []time.Duration{4 * slot}
	switch err := refunded[0]; {
	case err == nil:
	case errors.Is(err, pglimit.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		t.Logf("the give-back ran out of its time (%v): the slot may stay spent", err)
		want = append(want, 5*slot)
	default:
		t.Fatalf("the give-back's Refund: %v", err)
	}
	if code, d, err := s.call(ctx, 0, "bob"); err != nil || code != http.StatusOK || !slices.Contains(want, d) {
		t.Errorf("after the held client left: %d, held %s, %v; want held one of %v", code, d, err, want)
	}
}

// MaxDelay needs GCRA limits, and is not negative.
func TestMaxDelayConfig(t *testing.T) {
	t.Parallel()
	window := pglimit.Config{Schema: pglimittest.Schema(t), Limits: []pglimit.Limit{{Rate: 5, Period: time.Minute, Algorithm: pglimit.FixedWindow}}}
	lim, err := pglimit.New(pglimittest.Pool(t), &window)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{-time.Second, time.Second} {
		if _, err := pglimithttp.Middleware(lim, &pglimithttp.Config{MaxDelay: d}); !errors.Is(err, pglimithttp.ErrInvalidConfig) {
			t.Errorf("MaxDelay %s on a fixed window: %v, want ErrInvalidConfig", d, err)
		}
	}
}
