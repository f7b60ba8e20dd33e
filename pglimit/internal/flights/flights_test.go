package flights

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// leader starts a flight on key whose fn blocks until release is closed,
// and waits until the flight is registered.
func leader(t *testing.T, g *Group[int], key string, n int, release <-chan struct{}, answer int, err error) <-chan result {
	t.Helper()
	out := make(chan result, 1)
	go func() {
		d, err := g.Do(context.Background(), key, n, func(context.Context) (int, error) {
			<-release
			return answer, err
		}, nil)
		out <- result{d, err}
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		g.mu.Lock()
		_, ok := g.m[key]
		g.mu.Unlock()
		if ok {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatal("the leader's flight never started")
		}
	}
}

// waitFollowers waits until k callers have found key's flight.
func waitFollowers(t *testing.T, g *Group[int], key string, k int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		g.mu.Lock()
		fl := g.m[key]
		n := 0
		if fl != nil {
			n = fl.waiters
		}
		g.mu.Unlock()
		if n >= k {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d followers found the flight", n, k)
		}
	}
}

type result struct {
	d   int
	err error
}

// followers runs k callers of key and n concurrently, and returns their
// results once all have returned, with how many ran their own fn.
func followers(g *Group[int], k int, key string, n int, follow func(int, int, time.Duration) (int, bool), started *sync.WaitGroup) (func() []result, *atomic.Int64) {
	var own atomic.Int64
	res := make([]result, k)
	var wg sync.WaitGroup
	for i := range k {
		started.Add(1)
		wg.Go(func() {
			started.Done()
			d, err := g.Do(context.Background(), key, n, func(context.Context) (int, error) {
				own.Add(1)
				return -1, nil
			}, follow)
			res[i] = result{d, err}
		})
	}
	return func() []result { wg.Wait(); return res }, &own
}

func share(d, _ int, _ time.Duration) (int, bool) { return d, true }

// Followers of the same cost share the leader's answer when follow says
// so; a follower of another cost, or one that follow turns down, runs its
// own.
func TestShare(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		follow func(int, int, time.Duration) (int, bool)
		want   int // each follower's answer
		ownRun bool
	}{
		{"same cost", 1, share, 7, false},
		{"another cost", 2, share, -1, true},
		{"turned down", 1, func(int, int, time.Duration) (int, bool) { return 0, false }, -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New[int]()
			release := make(chan struct{})
			lead := leader(t, g, "k", 1, release, 7, nil)
			var started sync.WaitGroup
			wait, own := followers(g, 5, "k", tc.n, tc.follow, &started)
			started.Wait()
			waitFollowers(t, g, "k", 5)
			close(release)
			if r := <-lead; r.d != 7 || r.err != nil {
				t.Fatalf("leader: %+v", r)
			}
			for i, r := range wait() {
				if r.d != tc.want || r.err != nil {
					t.Errorf("follower %d: %+v, want %d", i, r, tc.want)
				}
			}
			if got := own.Load(); (got > 0) != tc.ownRun {
				t.Errorf("%d followers ran their own fn, want some: %t", got, tc.ownRun)
			}
		})
	}
}

// A leader's error is its followers' too, unless the leader gave up (its
// own context ended): then they decide afresh.
func TestLeaderError(t *testing.T) {
	g := New[int]()
	release := make(chan struct{})
	failed := errors.New("the database is down")
	lead := leader(t, g, "k", 1, release, 0, failed)
	var started sync.WaitGroup
	wait, own := followers(g, 3, "k", 1, share, &started)
	started.Wait()
	waitFollowers(t, g, "k", 3)
	close(release)
	<-lead
	for i, r := range wait() {
		if !errors.Is(r.err, failed) {
			t.Errorf("follower %d: %+v, want the leader's error", i, r)
		}
	}
	if own.Load() != 0 {
		t.Errorf("%d followers ran their own fn after the leader failed", own.Load())
	}

	ctx, cancel := context.WithCancel(context.Background())
	abandoned := make(chan struct{})
	go func() {
		_, _ = g.Do(ctx, "k2", 1, func(ctx context.Context) (int, error) {
			<-abandoned
			cancel()
			return 0, ctx.Err()
		}, nil)
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		g.mu.Lock()
		_, ok := g.m["k2"]
		g.mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the flight never started")
		}
	}
	done := make(chan result, 1)
	go func() {
		d, err := g.Do(context.Background(), "k2", 1, func(context.Context) (int, error) { return 9, nil }, share)
		done <- result{d, err}
	}()
	waitFollowers(t, g, "k2", 1)
	close(abandoned)
	if r := <-done; r.d != 9 || r.err != nil {
		t.Errorf("follower of an abandoned leader: %+v, want its own answer 9", r)
	}
}

// After Forget, a new caller starts a flight of its own; a nil group runs
// every caller's fn.
func TestForgetAndNil(t *testing.T) {
	g := New[int]()
	release := make(chan struct{})
	lead := leader(t, g, "k", 1, release, 7, nil)
	g.Forget("k")
	d, err := g.Do(context.Background(), "k", 1, func(context.Context) (int, error) { return 8, nil }, share)
	if d != 8 || err != nil {
		t.Errorf("after Forget: %d, %v; want a flight of its own, 8", d, err)
	}
	close(release)
	<-lead

	var none *Group[int]
	none.Forget("k")
	if d, err := none.Do(context.Background(), "k", 1, func(context.Context) (int, error) { return 3, nil }, share); d != 3 || err != nil {
		t.Errorf("nil group: %d, %v", d, err)
	}
}
