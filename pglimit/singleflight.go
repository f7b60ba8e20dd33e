package pglimit

import (
	"context"
	"sync"
	"time"
)

// flights coalesces concurrent decisions on one key in one process: the
// first caller (the leader) runs the statement, and callers that arrive for
// the same key and cost while it runs (followers) wait for its answer
// instead of running their own. A limiter of a single GCRA limit uses it
// wherever its batcher, which merges calls on one key itself, does not
// serve it: on Range, and on a table Citus distributes. All methods are safe
// on a nil *flights: no coalescing.
//
// A follower is never admitted by the leader's statement: only the leader
// owns an admission. A follower is refused when the leader's answer shows
// that the key is still short of the follower's units when the follower
// wakes up, judged as the pre-block judges (the statement ran after the
// leader was sent, so the elapsed time is over-counted and the wait
// under-counted); otherwise it runs its own statement. So sharing never
// refuses a request the database would have admitted when the follower
// arrived, and never admits one it would have refused.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct {
	n    int
	sent time.Time     // before the leader's statement was sent
	done chan struct{} // closed once d and err are set
	d    Decision
	err  error
	// abandoned: the leader's own context ended, so its error says
	// nothing about the followers' requests.
	abandoned bool
}

func newFlights() *flights { return &flights{m: make(map[string]*flight)} }

// do decides a request of n units on key: it runs fn, or shares the answer
// of a concurrent caller's fn through follow.
func (f *flights) do(ctx context.Context, key string, n int, fn func(context.Context) (Decision, error), follow func(Decision, int, time.Duration) (Decision, bool)) (Decision, error) {
	if f == nil {
		return fn(ctx)
	}
	for {
		f.mu.Lock()
		fl, ok := f.m[key]
		if !ok {
			fl = &flight{n: n, sent: time.Now(), done: make(chan struct{})}
			f.m[key] = fl
			f.mu.Unlock()
			return f.lead(ctx, key, fl, fn)
		}
		f.mu.Unlock()
		if fl.n != n {
			return fn(ctx) // another cost: its answer does not tell
		}
		select {
		case <-ctx.Done():
			return Decision{}, ctx.Err()
		case <-fl.done:
		}
		switch {
		case fl.abandoned:
			continue // decide afresh, perhaps as the next leader
		case fl.err != nil:
			return Decision{}, fl.err
		}
		if d, ok := follow(fl.d, n, time.Since(fl.sent)); ok {
			return d, nil
		}
		return fn(ctx)
	}
}

// lead runs fn for fl's followers and itself.
func (f *flights) lead(ctx context.Context, key string, fl *flight, fn func(context.Context) (Decision, error)) (Decision, error) {
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

// forget makes the next caller on key start a new flight: a Reset may have
// changed what the running one read. Followers already waiting were
// concurrent with the Reset and may still share its answer.
func (f *flights) forget(key string) {
	if f == nil {
		return
	}
	f.mu.Lock()
	delete(f.m, key)
	f.mu.Unlock()
}

// followGCRA is the follower's answer to a single GCRA limit's decision d,
// elapsed after its leader was sent: a refusal if n units still do not fit,
// else false. A decision that did not come from the database (a lost race,
// whose wait is an upper bound) is never shared.
func (l *limiter) followGCRA(d Decision, n int, elapsed time.Duration) (Decision, bool) {
	if d.at == 0 {
		return Decision{}, false
	}
	tat := d.at + d.ResetAfter.Microseconds()
	now := d.at + elapsed.Microseconds()
	out := l.gcraDecision(false, tat, now, n)
	if out.RetryAfter <= 0 {
		return Decision{}, false
	}
	return out, true
}
