// Package flights coalesces concurrent decisions on one key in one
// process: the first caller runs the statement, and the callers that
// arrive while it runs may share its answer instead of running their own.
package flights

import (
	"context"
	"sync"
	"time"
)

// Group coalesces concurrent decisions on one key in one process: the
// first caller (the leader) runs the statement, and callers that arrive for
// the same key and cost while it runs (followers) wait for its answer
// instead of running their own. A limiter of a single GCRA limit uses it
// wherever its batcher, which merges calls on one key itself, does not
// serve it: on Range, and on a table Citus distributes. All methods are safe
// on a nil *Group: no coalescing.
//
// A follower is never admitted by the leader's statement: only the leader
// owns an admission. A follower is refused when the leader's answer shows
// that the key is still short of the follower's units when the follower
// wakes up, judged as the pre-block judges (the statement ran after the
// leader was sent, so the elapsed time is over-counted and the wait
// under-counted), though the refusal reports the wait at the leader's
// database time; otherwise it runs its own statement. So sharing never
// refuses a request the database would have admitted when the follower
// arrived, and never admits one it would have refused.
type Group[D any] struct {
	mu sync.Mutex
	m  map[string]*flight[D]
}

type flight[D any] struct {
	n    int
	sent time.Time     // before the leader's statement was sent
	done chan struct{} // closed once d and err are set
	d    D
	err  error
	// abandoned: the leader's own context ended, so its error says
	// nothing about the followers' requests.
	abandoned bool
	// waiters counts the followers that found the flight (under the
	// group's mutex): what a test waits for before the leader returns.
	waiters int
}

// New returns an empty group.
func New[D any]() *Group[D] { return &Group[D]{m: make(map[string]*flight[D])} }

// Do decides a request of n units on key: it runs fn, or shares the answer
// of a concurrent caller's fn with the same n through follow, which is
// given that answer and the time since its leader was sent, and says
// whether it answers this caller too; if not, Do runs fn.
func (f *Group[D]) Do(ctx context.Context, key string, n int, fn func(context.Context) (D, error), follow func(D, int, time.Duration) (D, bool)) (D, error) {
	var zero D
	if f == nil {
		return fn(ctx)
	}
	for {
		f.mu.Lock()
		fl, ok := f.m[key]
		if !ok {
			fl = &flight[D]{n: n, sent: time.Now(), done: make(chan struct{})}
			f.m[key] = fl
			f.mu.Unlock()
			return f.lead(ctx, key, fl, fn)
		}
		fl.waiters++
		f.mu.Unlock()
		if fl.n != n {
			return fn(ctx) // another cost: its answer does not tell
		}
		select {
		case <-ctx.Done():
			return zero, ctx.Err()
		case <-fl.done:
		}
		switch {
		case fl.abandoned:
			continue // decide afresh, perhaps as the next leader
		case fl.err != nil:
			return zero, fl.err
		}
		if d, ok := follow(fl.d, n, time.Since(fl.sent)); ok {
			return d, nil
		}
		return fn(ctx)
	}
}

// lead runs fn for fl's followers and itself.
func (f *Group[D]) lead(ctx context.Context, key string, fl *flight[D], fn func(context.Context) (D, error)) (D, error) {
	defer func() {
		f.mu.Lock()
		if f.m[key] == fl {
			delete(f.m, key)
		}
		f.mu.Unlock()
		close(fl.done)
	}()
	fl.d, fl.err = fn(ctx)
	fl.abandoned = fl.err != nil && ctx.Err() != nil
	return fl.d, fl.err
}

// Forget makes the next caller on key start a new flight: a Reset may have
// changed what the running one read. Followers already waiting were
// concurrent with the Reset and may still share its answer.
func (f *Group[D]) Forget(key string) {
	if f == nil {
		return
	}
	f.mu.Lock()
	delete(f.m, key)
	f.mu.Unlock()
}
