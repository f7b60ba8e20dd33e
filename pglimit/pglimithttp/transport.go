package pglimithttp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pglimit/cooldown/internal/onerror"
	"github.com/pglimit/cooldown/pglimit"
)

// ErrThrottled reports an outbound request that a [Transport] did not send:
// its budget refused it (FailFast), or waiting for the budget or for the
// upstream's pause would send it only after its context's deadline. The
// error is a [*ThrottledError], which in the second case also matches
// [context.DeadlineExceeded].
var ErrThrottled = errors.New("pglimithttp: the upstream's budget refused the request")

// ThrottledError is the error of a request a Transport did not send, with
// when the budget may admit one again.
type ThrottledError struct {
	Key        string        // the budget's key
	RetryAfter time.Duration // when the budget may admit the request

	deadline bool // the request would go out only past its context's deadline
}

// Error names the key and the RetryAfter of the refused request.
func (e *ThrottledError) Error() string {
	if e.deadline {
		return fmt.Sprintf("pglimithttp: the budget of %q admits the request only past its deadline; retry after %s: %s", e.Key, e.RetryAfter, context.DeadlineExceeded)
	}
	return fmt.Sprintf("pglimithttp: the budget of %q refused the request; retry after %s", e.Key, e.RetryAfter)
}

// Unwrap makes the error match [ErrThrottled].
func (e *ThrottledError) Unwrap() error { return ErrThrottled }

// Is makes the error of a request that would go out only past its
// context's deadline match [context.DeadlineExceeded].
func (e *ThrottledError) Is(target error) bool {
	return e.deadline && target == context.DeadlineExceeded
}

// TransportConfig configures a [Transport]. Limiter is required; every
// other zero field takes its default.
type TransportConfig struct {
	// Limiter is the budget of the calls to an upstream, which every
	// instance shares through the database: one GCRA limit, at or under
	// the upstream's limit, without per-key limits, on the Upsert or
	// NoWait strategy.
	Limiter pglimit.Limiter

	// Key returns the budget's key of a request. Defaults to the request
	// URL's host: one budget per upstream host.
	Key func(r *http.Request) (string, error)

	// Base sends the requests. Defaults to [http.DefaultTransport].
	Base http.RoundTripper

	// FailFast, when true, fails a request the budget does not admit at
	// once with a [*ThrottledError]. Defaults to false: the request waits
	// its turn ([pglimit.Wait]), as long as its context allows; one whose
	// turn comes past its context's deadline fails at once, with a
	// [*ThrottledError] that matches [context.DeadlineExceeded].
	FailFast bool

	// MaxPause bounds the pause an upstream's answer sets: a Retry-After or
	// RateLimit value past it, or a date further off, counts as MaxPause.
	// From 1ms to 366 days. Defaults to 1 minute.
	MaxPause time.Duration

	// DefaultPause is the pause after a 429 whose Retry-After is missing
	// or not a delay (malformed, negative). At most MaxPause. Defaults to
	// 1 second.
	DefaultPause time.Duration

	// Retries is how many times a request answered 429 or 503 is sent
	// again, each once the pause has passed and the budget admits it, if
	// it can be sent again: an idempotent method (GET, HEAD, OPTIONS,
	// TRACE, PUT, DELETE) and no body or one GetBody can make afresh.
	// From 0 to 10. Defaults to 0.
	Retries int

	// Logger receives a warning when a pause cannot be stored (the
	// database is unavailable), at most once per LogInterval; the pause
	// then holds in this process only. Defaults to [slog.Default].
	Logger *slog.Logger
}

// Transport is an [http.RoundTripper] that keeps an application's calls to
// an upstream within a budget shared by every instance of the
// application, and makes every instance back off when the upstream says
// so. Before each request it takes a unit of the request's key from
// Limiter, waiting its turn or failing fast. A 429, or a 503 with
// Retry-After, or a RateLimit header with no units left, pauses the key
// for every instance ([pglimit.Pause]) for as long as the upstream said,
// clamped to MaxPause, and then the budget admits at its rate.
//
// The Transport that got the answer sends nothing more on the key until
// the pause ends, not even the requests already waiting for their turn
// with a unit reserved: each checks the pause again just before it is
// sent. Other instances learn of the pause through the database: none
// sends a request admitted after the pause was stored, but a request each
// had already admitted, waiting for its turn then, is sent when its turn
// comes, during the pause: at most one per request it had waiting. (A
// budget of 1,000 a second or more also spends the units it leased.)
// Requests already sent when the answer came are on their way.
//
// A request returns by its context's deadline or the Limiter's Timeout,
// whichever comes first, plus the time to hear the server's error or to
// give up on the connection (the tests allow 500 ms), even while the
// key's row is locked, the server stopped or the connection dead; an
// answer that pauses the key is returned by the deadline too, the pause
// stored for the other instances without the caller, within Timeout.
//
// A Transport keeps in memory one pause end per key whose pause it learnt
// is in force, dropped within a second of the pause's end.
// docs/outbound.md has the rules.
type Transport struct {
	cfg      TransportConfig
	failures *onerror.Log

	// paused is, per key, until when this process holds it back: the
	// pauses it learnt, kept also when the database could not store
	// them. An entry is dropped when it is looked up once it has passed,
	// or by the sweeper within pauseSweep of its end; the map is made
	// afresh once empty, as a map never shrinks.
	mu      sync.Mutex
	paused  map[string]time.Time
	sweeper *time.Timer // drops ended pauses; nil while none is kept
}

// pauseSweep is how often a Transport that holds pauses drops those that
// have ended: an entry outlives its pause by at most that.
const pauseSweep = time.Second

// NewTransport returns a Transport of cfg.
func NewTransport(cfg *TransportConfig) (*Transport, error) {
	if cfg == nil || cfg.Limiter == nil {
		return nil, fmt.Errorf("%w: TransportConfig.Limiter is required", ErrInvalidConfig)
	}
	c := *cfg
	if c.Key == nil {
		c.Key = hostKey
	}
	c.Base = cmp.Or[http.RoundTripper](c.Base, http.DefaultTransport)
	c.MaxPause = cmp.Or(c.MaxPause, time.Minute)
	c.DefaultPause = cmp.Or(c.DefaultPause, time.Second)
	switch {
	case c.MaxPause < time.Millisecond || c.MaxPause > 366*24*time.Hour:
		return nil, fmt.Errorf("%w: MaxPause must be from 1ms to 366 days, got %s", ErrInvalidConfig, c.MaxPause)
	case c.DefaultPause < 0 || c.DefaultPause > c.MaxPause:
		return nil, fmt.Errorf("%w: DefaultPause must be from 0 to MaxPause (%s), got %s", ErrInvalidConfig, c.MaxPause, c.DefaultPause)
	case c.Retries < 0 || c.Retries > 10:
		return nil, fmt.Errorf("%w: Retries must be from 0 to 10, got %d", ErrInvalidConfig, c.Retries)
	}
	for i, l := range c.Limiter.Policy().Limits {
		if l.Algorithm != pglimit.GCRA {
			return nil, fmt.Errorf("%w: the Limiter's Limits[%d] (%q) is %s; a Transport's budget is GCRA", ErrInvalidConfig, i, l.Name, l.Algorithm)
		}
	}
	return &Transport{
		cfg:      c,
		failures: &onerror.Log{Logger: c.Logger, Interval: 10 * time.Second, Message: "pglimithttp: transport: the pause is held in this process only"},
	}, nil
}

// hostKey is the default Key: the request's host.
func hostKey(r *http.Request) (string, error) {
	if r.URL == nil || r.URL.Host == "" {
		return "", errors.New("the request has no host")
	}
	return r.URL.Host, nil
}

// RoundTrip sends req once the budget of its key admits it, and learns
// from the answer.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key, err := t.cfg.Key(req)
	if err == nil {
		err = pglimit.ValidateKey(key)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: Transport: the request's key: %w", pglimit.ErrInvalidKey, err)
	}
	ctx := req.Context()
	for attempt := 0; ; attempt++ {
		if err := t.admit(ctx, key); err != nil {
			return nil, err
		}
		resp, err := t.cfg.Base.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		pause, ok := t.pauseOf(resp)
		if !ok {
			return resp, nil
		}
		t.pause(ctx, key, pause)
		if attempt >= t.cfg.Retries || !replayable(req) || !(resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
			return resp, nil
		}
		next, err := rewind(req)
		if err != nil {
			return resp, nil
		}
		// The retry's answer is returned; this one is read and closed.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		req = next
	}
}

// admit takes a unit of key's budget: at once (FailFast) or in its turn,
// after any pause this process knows of. A pause this process learns of
// while the request waits for its turn holds the request back too: the
// unit it took is spent, and it waits out the pause and takes another.
func (t *Transport) admit(ctx context.Context, key string) error {
	for {
		if err := t.awaitPause(ctx, key); err != nil {
			return err
		}
		if err := t.take(ctx, key); err != nil {
			return err
		}
		if _, paused := t.pausedUntil(key); !paused {
			return nil
		}
	}
}

// awaitPause waits out the pause of key this process knows of, if any.
func (t *Transport) awaitPause(ctx context.Context, key string) error {
	until, ok := t.pausedUntil(key)
	if !ok {
		return nil
	}
	wait := time.Until(until)
	if t.cfg.FailFast {
		return &ThrottledError{Key: key, RetryAfter: wait}
	}
	if deadline, ok := ctx.Deadline(); ok && deadline.Before(until) {
		return &ThrottledError{Key: key, RetryAfter: wait, deadline: true}
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
		return nil
	}
}

// take takes a unit of key's budget: at once (FailFast) or in its turn.
func (t *Transport) take(ctx context.Context, key string) error {
	if t.cfg.FailFast {
		d, err := t.cfg.Limiter.Allow(ctx, key)
		switch {
		case err != nil:
			return err
		case !d.Allowed:
			return &ThrottledError{Key: key, RetryAfter: d.RetryAfter}
		}
		return nil
	}
	// The time ctx leaves, read before the wait: WaitAtMost's refusal
	// waits that much less (pglimit.Reserve), so RetryAfter below is the
	// whole wait, or a few µs more.
	left, deadline := maxWait, false
	if dl, ok := ctx.Deadline(); ok {
		left, deadline = min(time.Until(dl), maxWait), true
	}
	d, err := pglimit.WaitAtMost(ctx, t.cfg.Limiter, key, 1, maxWait)
	switch {
	case err != nil:
		return err
	case !d.Allowed: // the unit comes only past the deadline
		return &ThrottledError{Key: key, RetryAfter: d.RetryAfter + left, deadline: deadline}
	}
	return nil
}

// maxWait is the longest a request waits for its unit when its context
// has no deadline: the longest pglimit.WaitAtMost takes.
const maxWait = 366 * 24 * time.Hour

// pausedUntil returns until when this process holds key back, if it does.
func (t *Transport) pausedUntil(key string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	until, ok := t.paused[key]
	if ok && !time.Now().Before(until) {
		delete(t.paused, key)
		return time.Time{}, false
	}
	return until, ok
}

// pause holds key back for d: in this process at once, and in the
// database for every instance. It waits for the database as long as ctx
// lasts; the pause is stored on past it, within the Limiter's Timeout,
// without the caller, who has its answer.
func (t *Transport) pause(ctx context.Context, key string, d time.Duration) {
	now := time.Now()
	until := now.Add(d)
	t.mu.Lock()
	if t.paused == nil {
		t.paused = map[string]time.Time{}
	}
	if old, ok := t.paused[key]; !ok || until.After(old) {
		t.paused[key] = until
	}
	if t.sweeper == nil {
		t.sweeper = time.AfterFunc(pauseSweep, t.sweep)
	}
	t.mu.Unlock()
	stored := make(chan struct{})
	go func() {
		defer close(stored)
		if err := pglimit.Pause(context.WithoutCancel(ctx), t.cfg.Limiter, key, d); err != nil {
			t.failures.Record(time.Now(), "key", key, "err", err)
		}
	}()
	select {
	case <-stored:
	case <-ctx.Done():
	}
}

// sweep is the sweeper's: it drops the pauses that have ended, and comes
// back while any is kept. The last one gone, it lets the map go too.
func (t *Transport) sweep() {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	for k, u := range t.paused {
		if !now.Before(u) {
			delete(t.paused, k)
		}
	}
	if len(t.paused) > 0 {
		t.sweeper.Reset(pauseSweep)
		return
	}
	t.paused, t.sweeper = nil, nil
}

// pauseOf is how long resp says to hold back its key, clamped to
// MaxPause, if it says to: a 429, or a 503 with Retry-After, or a
// RateLimit header with no units left.
func (t *Transport) pauseOf(resp *http.Response) (time.Duration, bool) {
	ra := resp.Header.Get("Retry-After")
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		d, ok := parseRetryAfter(ra, time.Now())
		if !ok {
			d = t.cfg.DefaultPause
		}
		return min(d, t.cfg.MaxPause), d > 0
	case resp.StatusCode == http.StatusServiceUnavailable && ra != "":
		d, ok := parseRetryAfter(ra, time.Now())
		return min(d, t.cfg.MaxPause), ok && d > 0
	}
	if d, ok := spentRateLimit(resp.Header.Get("RateLimit")); ok {
		return min(d, t.cfg.MaxPause), d > 0
	}
	return 0, false
}

// parseRetryAfter reads a Retry-After value (RFC 9110): a delay in whole
// seconds, or an HTTP date, which is counted from now. It reports false
// for anything else, a negative delay among them. A delay past what a
// time.Duration holds is the longest one.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		s, err := strconv.ParseUint(v, 10, 64)
		switch {
		case errors.Is(err, strconv.ErrRange) || err == nil && s > uint64(maxSeconds):
			return time.Duration(maxSeconds) * time.Second, true
		case err != nil:
			return 0, false
		}
		return time.Duration(s) * time.Second, true
	}
	when, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(when.Sub(now), 0), true
}

// maxSeconds is the longest delay parseRetryAfter reads, in seconds.
const maxSeconds = int64(1<<63-1) / int64(time.Second)

// spentRateLimit reads the IETF RateLimit field (draft-ietf-httpapi-
// ratelimit-headers: "name";r=<remaining>;t=<seconds>, ...): when a
// policy has no units left (r=0), how long until it resets (t).
func spentRateLimit(v string) (time.Duration, bool) {
	var longest time.Duration
	spent := false
	for item := range strings.SplitSeq(v, ",") {
		var r, t int64 = -1, -1
		for param := range strings.SplitSeq(item, ";") {
			name, value, ok := strings.Cut(strings.TrimSpace(param), "=")
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 0 {
				continue
			}
			switch name {
			case "r":
				r = n
			case "t":
				t = min(n, maxSeconds)
			}
		}
		if r == 0 && t > 0 {
			spent, longest = true, max(longest, time.Duration(t)*time.Second)
		}
	}
	return longest, spent
}

// replayable reports whether req may be sent again: an idempotent method,
// and a body that can be made afresh, if any.
func replayable(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	}
	return false
}

// rewind returns req to send again, with its body afresh.
func rewind(req *http.Request) (*http.Request, error) {
	next := req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		next.Body = body
	}
	return next, nil
}
