package pglimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
)

// Fallback makes a limiter decide Allow and AllowN in process while the
// database is unavailable, instead of failing: each instance then
// enforces Limits on its own, per key, from its own clock. Give it the
// shared limit divided by the number of instances, say.
//
// The database is unavailable when a call cannot connect or loses its
// connection ([ErrUnavailable]), times out ([ErrTimeout]), or finds a
// server that cannot write ([ErrReadOnly]), and the database decided no
// other call of the limiter while it waited. A call that waited for its
// key alone (a row another transaction holds) is decided in process, and
// no fallback starts: one that times out while the others are decided,
// and one the server's lock_timeout ends (SQLSTATE 55P03), which is logged
// as a locked row at most every 10 s, never as an outage. A caller's own
// cancellation or deadline, and bad input, are not outages. While it is
// unavailable, one call every Retry tries the database again, and the
// others decide at once; the first that the database answers ends the
// fallback. Decisions
// made in process have [Decision.Fallback] set, and the start and end of
// each fallback are logged. A cost that Limits could never admit at once
// is then [ErrInvalidCost], as one beyond the limiter's own limits always
// is.
type Fallback struct {
	// Limits are the in-process limits, all GCRA, at most [MaxLimits].
	Limits []Limit

	// MaxKeys bounds how many keys the fallback remembers. Past it, keys
	// back at their full burst are forgotten first, then any, which gives
	// them their full burst again; when the fallback ends, it forgets every
	// key. Defaults to 100,000.
	MaxKeys int

	// Retry is how often, while the database is unavailable, a call tries
	// it again; that call waits for it, up to Config.Timeout. Defaults to
	// 250 ms.
	Retry time.Duration

	// Logger receives a warning when a fallback starts and a line when it
	// ends, with how many decisions it made. Defaults to slog.Default().
	Logger *slog.Logger
}

const (
	defaultFallbackKeys  = 100_000
	defaultFallbackRetry = 250 * time.Millisecond
)

// fallback is a limiter's in-process stand-in, and the state of the
// database as its calls last saw it.
type fallback struct {
	policy  *Policy
	t, bt   []int64 // µs per limit: the emission interval T and the tolerance Burst*T
	maxKeys int
	retry   time.Duration
	log     *slog.Logger
	start   time.Time // the local clock's origin

	mu   sync.Mutex
	tats map[string][]int64 // µs since start, per limit

	down    atomic.Bool
	heard   atomic.Int64 // µs since start: when the database last decided a call
	probeAt atomic.Int64 // µs since start: when the next call may try the database
	since   atomic.Int64 // µs since start: when this fallback began
	decided atomic.Int64 // decisions made since
	lockLog atomic.Int64 // µs since start: when a locked row may be logged again
}

// lockLogInterval is how often at most a fallback logs a row locked past
// the server's lock_timeout: one row held long can time out every call on
// its key.
const lockLogInterval = 10 * time.Second

func newFallback(f *Fallback, namespace string) (*fallback, error) {
	if len(f.Limits) == 0 || len(f.Limits) > MaxLimits {
		return nil, fmt.Errorf("%w: Fallback.Limits: from 1 to %d limits, got %d", ErrInvalidConfig, MaxLimits, len(f.Limits))
	}
	if f.MaxKeys < 0 || f.Retry < 0 {
		return nil, fmt.Errorf("%w: Fallback: MaxKeys and Retry must not be negative", ErrInvalidConfig)
	}
	fb := &fallback{
		policy:  &Policy{Namespace: namespace},
		maxKeys: cmp.Or(f.MaxKeys, defaultFallbackKeys),
		retry:   cmp.Or(f.Retry, defaultFallbackRetry),
		log:     cmp.Or(f.Logger, slog.Default()),
		start:   time.Now(),
		tats:    map[string][]int64{},
	}
	for i, l := range f.Limits {
		l, err := l.withDefaults(i)
		if err != nil {
			return nil, fmt.Errorf("Fallback: %w", err)
		}
		if l.Algorithm != GCRA {
			return nil, fmt.Errorf("%w: Fallback.Limits[%d]: in-process limits are GCRA, not %s", ErrInvalidConfig, i, l.Algorithm)
		}
		fb.policy.Limits = append(fb.policy.Limits, l)
		fb.t = append(fb.t, l.emission())
		fb.bt = append(fb.bt, int64(l.Burst)*l.emission())
	}
	return fb, nil
}

func (f *fallback) now() int64 { return time.Since(f.start).Microseconds() }

// skipDatabase reports whether a call should decide in process without
// trying the database: it is down, and another call tried it less than
// Retry ago.
func (f *fallback) skipDatabase() bool {
	if !f.down.Load() {
		return false
	}
	now, at := f.now(), f.probeAt.Load()
	return now < at || !f.probeAt.CompareAndSwap(at, now+f.retry.Microseconds())
}

// fail records that the database failed a call with err, which is an
// outage, and starts a fallback if none is under way.
func (f *fallback) fail(namespace string, err error) {
	now := f.now()
	f.probeAt.Store(now + f.retry.Microseconds())
	if f.down.CompareAndSwap(false, true) {
		f.since.Store(now)
		f.decided.Store(0)
		f.log.Warn("pglimit: the database is unavailable; deciding in process", "namespace", namespace, "err", err)
	}
}

// locked records that the server gave up waiting for key's row, which
// another transaction holds, by its lock_timeout (err): the database is
// up, so no fallback starts. It logs so, at most once per lockLogInterval.
func (f *fallback) locked(namespace, key string, err error) {
	now, at := f.now(), f.lockLog.Load()
	if now >= at && f.lockLog.CompareAndSwap(at, now+lockLogInterval.Microseconds()) {
		f.log.Warn("pglimit: a key's row is locked past the server's lock_timeout by another transaction; deciding the call in process",
			"namespace", namespace, "key", key, "err", err)
	}
}

// answered records that the database decided a call, ending a fallback.
func (f *fallback) answered(namespace string) {
	f.heard.Store(f.now())
	if f.down.CompareAndSwap(true, false) {
		// The keys' in-process state served the fallback alone: it goes
		// with it (a new map, as clear would keep the old one's size).
		f.mu.Lock()
		f.tats = map[string][]int64{}
		f.mu.Unlock()
		f.log.Info("pglimit: the database answers again; back to it", "namespace", namespace,
			"fallback_decisions", f.decided.Load(), "after", micros(f.now()-f.since.Load()).Round(time.Millisecond))
	}
}

// decide admits n units of key if every in-process limit allows them, by
// GCRA on the local clock.
func (f *fallback) decide(key string, n int) Decision {
	f.decided.Add(1)
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	tats, ok := f.tats[key]
	if !ok {
		f.makeRoom(now)
		tats = make([]int64, len(f.t))
		for i := range tats {
			tats[i] = now
		}
		f.tats[key] = tats
	}
	d := Decision{Fallback: true, policy: f.policy}
	var wait int64
	for i, tat := range tats {
		if over := max(tat, now) + int64(n)*f.t[i] - f.bt[i] - now; over > 0 {
			d.violated |= 1 << i
			if over > wait {
				wait, d.Limit = over, f.policy.Limits[i]
			}
		}
	}
	if d.violated != 0 {
		d.RetryAfter = micros(wait)
		d.ResetAfter = d.RetryAfter
		return d
	}
	d.Allowed, d.Granted = true, n
	for i := range tats {
		tats[i] = max(tats[i], now) + int64(n)*f.t[i]
		left := int((f.bt[i] - (tats[i] - now)) / f.t[i])
		if i == 0 || left < d.Remaining {
			d.Remaining, d.Limit = left, f.policy.Limits[i]
		}
		d.ResetAfter = max(d.ResetAfter, micros(tats[i]-now))
	}
	return d
}

// makeRoom forgets keys when the map is full: those back at their full
// burst first, then as many others as it takes to make a tenth of it free.
func (f *fallback) makeRoom(now int64) {
	if len(f.tats) < f.maxKeys {
		return
	}
	for k, tats := range f.tats {
		if slices.Max(tats) <= now {
			delete(f.tats, k)
		}
	}
	for k := range f.tats {
		if len(f.tats) < f.maxKeys-f.maxKeys/10 {
			break
		}
		delete(f.tats, k)
	}
}

// outage reports whether err, from a call whose context is ctx, means the
// database is unavailable: no connection, a lost one, a timeout, a server
// that cannot write or is going away. The caller's own cancellation or
// deadline is not one.
func outage(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	return errors.Is(err, ErrTimeout) || errors.Is(err, ErrReadOnly) || errors.Is(err, ErrUnavailable) || pgtx.Unavailable(err)
}

// withFallback decides n units of key, a valid key, with db, or in
// process while the database is unavailable: the limiter has a fallback.
func (l *limiter) withFallback(ctx context.Context, key string, n int, db func() (Decision, error)) (Decision, error) {
	f := l.fallback
	local := func() (Decision, error) {
		if err := ctx.Err(); err != nil {
			return Decision{}, err // the caller gave up
		}
		if err := costFits(f.policy.Limits, n, modeAllow, 0); err != nil {
			// Refused, it would be told to come back when no time
			// would do.
			return Decision{}, fmt.Errorf("pglimit: in process: %w", err)
		}
		d := f.decide(key, n)
		if l.cfg.Shadow && !d.Allowed {
			d = d.shadowed(n)
		}
		return d, nil
	}
	if f.skipDatabase() {
		return local()
	}
	began := f.now()
	d, err := db()
	switch {
	case err == nil:
		f.answered(l.cfg.Namespace)
		return d, nil
	case outage(ctx, err) && f.heard.Load() > began:
		// The database decided another call while this one waited: it is
		// up, and this key's row is held (by a long transaction, say).
		// This call is decided in process; the others are not.
		return local()
	case ctx.Err() == nil && pgtx.Code(err) == pgtx.CodeLockNotAvailable:
		// The server answered: it gave up on this key's row by its
		// lock_timeout. The database is up; only this call is decided in
		// process.
		f.locked(l.cfg.Namespace, key, err)
		return local()
	case outage(ctx, err):
		f.fail(l.cfg.Namespace, err)
		return local()
	}
	return d, err
}
