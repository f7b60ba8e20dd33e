package pglimithttp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// ErrorPolicy says what the middleware answers when the limiter fails
// (database down, decision timed out).
type ErrorPolicy int

const (
	// Unavailable answers 503 Service Unavailable. It is the default: the
	// failure is the server's, so a 429 would tell a well-behaved client it
	// broke a quota it did not break, and failing open would silently remove
	// the protection from exactly the expensive endpoints a cooldown guards.
	Unavailable ErrorPolicy = iota

	// FailOpen lets the request through to the handler, unlimited.
	FailOpen

	// FailClosed refuses the request with 429, as if the key were in its
	// cooldown, with Retry-After set to the whole cooldown.
	FailClosed
)

func (p ErrorPolicy) String() string {
	switch p {
	case Unavailable:
		return "unavailable"
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	}
	return fmt.Sprintf("ErrorPolicy(%d)", int(p))
}

// ParseErrorPolicy returns the policy named s: "unavailable", "fail-open" or
// "fail-closed".
func ParseErrorPolicy(s string) (ErrorPolicy, error) {
	for _, p := range []ErrorPolicy{Unavailable, FailOpen, FailClosed} {
		if s == p.String() {
			return p, nil
		}
	}
	return 0, fmt.Errorf("pglimithttp: error policy %q is not one of unavailable, fail-open, fail-closed", s)
}

// Outcome is what the middleware did with a request.
type Outcome string

// Outcomes reported in [Event.Outcome].
const (
	OutcomeAdmitted    Outcome = "admitted"    // passed to the handler
	OutcomeRefused     Outcome = "refused"     // 429: the key is in its cooldown
	OutcomeBadKey      Outcome = "bad_key"     // 400: no valid key in the request
	OutcomeFailOpen    Outcome = "fail_open"   // limiter failed; passed to the handler
	OutcomeFailClosed  Outcome = "fail_closed" // limiter failed; 429
	OutcomeUnavailable Outcome = "unavailable" // limiter failed; 503

	// OutcomeCanceled: the request's context was cancelled while the
	// limiter decided, as when the client disconnects. The client gave up;
	// the limiter did not fail, so no error policy applies. Answered with
	// 499, which nobody reads but access logs and metrics record.
	OutcomeCanceled Outcome = "canceled"
)

// statusClientClosedRequest is nginx's code for a client that went away
// before the answer.
const statusClientClosedRequest = 499

// Event describes one decision, for logging and metrics.
type Event struct {
	Key      string // the extracted key; "" when extraction failed
	Outcome  Outcome
	Decision pglimit.Decision // zero unless the limiter decided
	Err      error            // the key or limiter error, if any
}

// Config configures [Middleware].
type Config struct {
	// Cooldown is the limiter's cooldown. The middleware cannot ask the
	// limiter for it and advertises it as the window of RateLimit-Policy.
	// Required; must be positive.
	Cooldown time.Duration

	// KeyFunc extracts the limiter key from a request. Defaults to
	// RemoteIP(nil): the peer's address, X-Forwarded-For ignored.
	KeyFunc KeyFunc

	// Policy names the quota policy in the RateLimit headers and the
	// problem body. Printable ASCII, at most 64 bytes. Defaults to
	// "cooldown".
	Policy string

	// OnError chooses the answer when the limiter fails. Defaults to
	// [Unavailable].
	OnError ErrorPolicy

	// OnDecision, when set, is called once per request with what happened,
	// before the handler runs or the refusal is written. Defaults to nil.
	OnDecision func(r *http.Request, ev Event)
}

const (
	defaultPolicy  = "cooldown"
	maxPolicyBytes = 64
)

// ErrInvalidConfig reports a [Config] that cannot be used; the message names
// the field.
var ErrInvalidConfig = errors.New("pglimithttp: invalid config")

// Middleware returns a middleware that asks lim before every request.
func Middleware(lim pglimit.Limiter, cfg *Config) (func(http.Handler) http.Handler, error) {
	if lim == nil {
		return nil, fmt.Errorf("%w: limiter is nil", ErrInvalidConfig)
	}
	if cfg == nil {
		return nil, fmt.Errorf("%w: Config is nil; Cooldown is required", ErrInvalidConfig)
	}
	c := *cfg
	if c.Cooldown <= 0 {
		return nil, fmt.Errorf("%w: Cooldown must be positive, got %s", ErrInvalidConfig, c.Cooldown)
	}
	c.Policy = cmp.Or(c.Policy, defaultPolicy)
	if err := validatePolicy(c.Policy); err != nil {
		return nil, fmt.Errorf("%w: Policy: %w", ErrInvalidConfig, err)
	}
	if c.KeyFunc == nil {
		c.KeyFunc = RemoteIP(nil)
	}
	switch c.OnError {
	case Unavailable, FailOpen, FailClosed:
	default:
		return nil, fmt.Errorf("%w: OnError: unknown %s", ErrInvalidConfig, c.OnError)
	}
	m := &middleware{lim: lim, cfg: c, policy: formatPolicy(c.Policy, c.Cooldown)}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(w, r, next)
		})
	}, nil
}

type middleware struct {
	lim    pglimit.Limiter
	cfg    Config
	policy string // the RateLimit-Policy field value, the same on every response
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, err := m.cfg.KeyFunc(r)
	if err == nil {
		// Checked here so that a bad key is a 400, never a database error.
		err = pglimit.ValidateKey(key)
	}
	if err != nil {
		m.report(r, Event{Key: key, Outcome: OutcomeBadKey, Err: err})
		writeProblem(w, http.StatusBadRequest, problem{
			Title:  "Bad Request",
			Detail: "no valid rate limit key in the request: " + err.Error(),
		})
		return
	}

	d, err := m.lim.Allow(r.Context(), key)
	h := w.Header()
	switch {
	case err != nil && errors.Is(err, context.Canceled) && errors.Is(r.Context().Err(), context.Canceled):
		m.report(r, Event{Key: key, Outcome: OutcomeCanceled, Err: err})
		w.WriteHeader(statusClientClosedRequest)
	case err != nil:
		m.fail(w, r, next, key, err)
	case d.Allowed:
		m.report(r, Event{Key: key, Outcome: OutcomeAdmitted, Decision: d})
		h.Set("RateLimit-Policy", m.policy)
		h.Set("RateLimit", formatRateLimit(m.cfg.Policy, d.ResetAfter))
		next.ServeHTTP(w, r)
	default:
		m.report(r, Event{Key: key, Outcome: OutcomeRefused, Decision: d})
		m.refuse(w, d.RetryAfter)
	}
}

// fail applies the error policy to a limiter failure.
func (m *middleware) fail(w http.ResponseWriter, r *http.Request, next http.Handler, key string, err error) {
	switch m.cfg.OnError {
	case FailOpen:
		m.report(r, Event{Key: key, Outcome: OutcomeFailOpen, Err: err})
		next.ServeHTTP(w, r)
	case FailClosed:
		m.report(r, Event{Key: key, Outcome: OutcomeFailClosed, Err: err})
		m.refuse(w, m.cfg.Cooldown)
	default:
		m.report(r, Event{Key: key, Outcome: OutcomeUnavailable, Err: err})
		// The cause stays in the server's logs (OnDecision): it names
		// hosts and SQL states a client has no business seeing.
		w.Header().Set("Retry-After", formatSeconds(retryAfterSeconds(m.cfg.Cooldown)))
		writeProblem(w, http.StatusServiceUnavailable, problem{
			Title:  "Service Unavailable",
			Detail: "the rate limiter cannot decide right now; try again later",
		})
	}
}

// refuse writes a 429 that tells the client to wait for wait.
func (m *middleware) refuse(w http.ResponseWriter, wait time.Duration) {
	secs := retryAfterSeconds(wait)
	h := w.Header()
	h.Set("Retry-After", formatSeconds(secs))
	h.Set("RateLimit-Policy", m.policy)
	// t equals Retry-After: the draft asks that Retry-After not point
	// earlier than the end of the effective window.
	h.Set("RateLimit", formatRateLimit(m.cfg.Policy, time.Duration(secs)*time.Second))
	writeProblem(w, http.StatusTooManyRequests, problem{
		Type:             quotaExceededType,
		Title:            "Too Many Requests",
		Detail:           fmt.Sprintf("the %s policy allows one request every %s; retry in %d s", m.cfg.Policy, m.cfg.Cooldown, secs),
		ViolatedPolicies: []string{m.cfg.Policy},
	})
}

func (m *middleware) report(r *http.Request, ev Event) {
	if m.cfg.OnDecision != nil {
		m.cfg.OnDecision(r, ev)
	}
}
