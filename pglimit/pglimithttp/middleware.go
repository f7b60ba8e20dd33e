package pglimithttp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pglimit/cooldown/internal/onerror"
	"github.com/pglimit/cooldown/internal/onpglimit/observe"
	"github.com/pglimit/cooldown/pglimit"
)

// ErrorPolicy says what the middleware answers when the limiter fails
// (database down, decision timed out). The gRPC interceptors
// (pglimitgrpc) take the same values.
type ErrorPolicy = onerror.Policy

const (
	// Unavailable answers 503 Service Unavailable. It is the default: the
	// failure is the server's, so a 429 would tell a well-behaved client it
	// broke a quota it did not break, and failing open would silently remove
	// the protection from exactly the expensive endpoints a limit guards.
	// Retry-After is the shortest interval between two units of any
	// limit (Period/Rate): an outage has nothing to do with the client's
	// quota, and a day-long quota must not send clients away for a day.
	Unavailable = onerror.Unavailable

	// FailOpen lets the request through to the handler, unlimited.
	FailOpen = onerror.FailOpen

	// FailClosed refuses the request with 429, as if the key had exhausted
	// its limits, with Retry-After set to the longest wait any limit can
	// impose ([pglimit.Policy.LongestWait]).
	FailClosed = onerror.FailClosed
)

// ParseErrorPolicy returns the policy named s: "unavailable", "fail-open" or
// "fail-closed".
func ParseErrorPolicy(s string) (ErrorPolicy, error) {
	p, err := onerror.Parse(s)
	if err != nil {
		return 0, fmt.Errorf("pglimithttp: %w", err)
	}
	return p, nil
}

// Outcome is what the middleware did with a request.
type Outcome string

// Outcomes reported in [Event.Outcome]. The words are those of the
// metrics (pglimitprom, pglimitotel) and of pglimitgrpc's events.
const (
	OutcomeAdmitted    Outcome = observe.Admitted    // passed to the handler
	OutcomeRefused     Outcome = observe.Refused     // 429: a limit refused the key
	OutcomeBadKey      Outcome = observe.BadKey      // 400: no valid key in the request
	OutcomeBadCost     Outcome = observe.BadCost     // 400: CostFunc failed, or the cost is not valid; nothing consumed
	OutcomeFailOpen    Outcome = observe.FailOpen    // limiter failed; passed to the handler
	OutcomeFailClosed  Outcome = observe.FailClosed  // limiter failed; 429
	OutcomeUnavailable Outcome = observe.Unavailable // limiter failed; 503
	OutcomeExempt      Outcome = observe.Exempt      // Exempt or ExemptKeys: passed to the handler, no decision
	OutcomeShadowed    Outcome = observe.Shadowed    // a refusal the limiter's shadow mode let through to the handler

	// OutcomeCanceled: the request's context was cancelled while the
	// limiter decided, as when the client disconnects. The client gave up;
	// the limiter did not fail, so no error policy applies. Answered with
	// 499, which nobody reads but access logs and metrics record.
	OutcomeCanceled Outcome = observe.Canceled
)

// statusClientClosedRequest is nginx's code for a client that went away
// before the answer.
const statusClientClosedRequest = 499

// Event describes one decision, for logging and metrics.
type Event struct {
	Key      string // the extracted key; "" when extraction failed
	Cost     int    // the request's cost; 0 when it was not computed or not valid
	Outcome  Outcome
	Decision pglimit.Decision // zero unless the limiter decided
	Err      error            // the key, cost or limiter error, if any
}

// CostFunc returns how many units of the limits a request uses, such as the
// number of items it creates. An error, or a cost that is not positive or
// larger than the limits admit at once, is answered 400 and consumes
// nothing.
type CostFunc func(r *http.Request) (int, error)

// Config configures [Middleware]. The limits, their names and windows come
// from the limiter ([pglimit.Limiter.Policy]).
type Config struct {
	// KeyFunc extracts the limiter key from a request. Defaults to
	// [RemoteIP] with no trusted proxies: the peer's address (its /64 for
	// IPv6), forwarding headers ignored.
	KeyFunc KeyFunc

	// Exempt, when it returns true, lets a request through to the handler
	// before any key is extracted, unlimited and without RateLimit headers:
	// health checks, an internal caller authenticated by an earlier
	// middleware. Defaults to nil: no request is exempt.
	Exempt func(r *http.Request) bool

	// ExemptKeys are keys that are never limited, such as a monitoring
	// system's address: a request whose key is one of them goes to the
	// handler as an Exempt one does. Defaults to none.
	ExemptKeys []string

	// OnRefused writes the response to a refused request in place of the
	// default 429 problem+json body: an HTML page, another JSON shape.
	// Retry-After and the RateLimit headers are already set; it chooses
	// the status and the body. [DecisionFrom] gives it the decision; a
	// fail-closed refusal ([FailClosed]) has none. Defaults to nil: the
	// problem+json 429.
	OnRefused http.Handler

	// Logger receives a warning when the limiter fails (database down,
	// timeout), at most one line per LogInterval, the first at once; each
	// line counts the failures left out since the previous one. During an
	// outage every request fails, and a line for each would bury the logs
	// when they matter. Use slog.New(slog.DiscardHandler) for none.
	// Defaults to slog.Default(), as it is when the failure happens.
	Logger *slog.Logger

	// LogInterval is the shortest time between two failure lines.
	// Defaults to 10s.
	LogInterval time.Duration

	// CostFunc returns a request's cost. Defaults to nil: every request
	// costs 1.
	CostFunc CostFunc

	// OnError chooses the answer when the limiter fails. Defaults to
	// [Unavailable].
	OnError ErrorPolicy

	// OnDecision, when set, is called once per request with what happened,
	// before the handler runs or the refusal is written. Defaults to nil.
	OnDecision func(r *http.Request, ev Event)

	// MaxDelay shapes traffic as nginx's limit_req without nodelay: a
	// request the limits would admit within MaxDelay is held until its
	// slot and then served, so the handler sees requests at the limits'
	// rate; one that would wait longer is refused. Slots are the
	// database's, so the pace holds across instances, and a held request
	// whose client goes away gives its slot back ([pglimit.WaitAtMost]).
	// A refusal's Retry-After is when a retry would be held within
	// MaxDelay, not when its slot comes: the wait less MaxDelay.
	// The limiter's limits must all be GCRA. nginx's "rate=r burst=b"
	// is a limit of r with Burst 1 and MaxDelay b/r; "burst=b delay=d"
	// is Burst d+1 and MaxDelay (b-d)/r; "burst=b nodelay" is Burst b+1
	// and MaxDelay 0, since nginx serves b requests past the first.
	// [DecisionFrom] gives the handler the decision, whose Delay is how
	// long the request was held. A limiter's Config.Fallback does not
	// hold requests: while the database is unavailable they meet OnError.
	// Defaults to 0: admitted requests are served at once, refused ones
	// refused.
	MaxDelay time.Duration

	// Settle, when true, settles each admitted request at its real cost
	// once the handler returns ([pglimit.Settle]): the cost the handler
	// recorded with [SetCost], or else the integer it set in the response
	// header CostHeader. The estimate, CostFunc's, is given back where it
	// exceeded the real cost and the excess charged, into the limits'
	// Debt. A request whose handler reports no cost keeps its estimate.
	// The settle runs before the response is finished, within the
	// limiter's Timeout, even if the client has gone; one that fails
	// keeps the estimate and is logged. With [Levels], every level is
	// settled at the same cost; to settle one limit and not the others,
	// wrap its middleware in theirs (package doc, "Stacking middlewares").
	// Defaults to false.
	Settle bool

	// FlowFunc, for [Concurrency] only, makes a request wait for a slot
	// of its key as a waiter of the flow it returns (a tenant and its
	// weight), with weighted fair share across the flows that wait
	// ([pglimitsem.Semaphore.WaitFlow]), rather than be refused at once
	// when every slot is held. An error, or a flow that is not valid, is
	// a 400 as a bad key is. Defaults to nil: Concurrency acquires without
	// waiting.
	FlowFunc FlowFunc

	// LevelFunc, for [Concurrency] only, gives a request's priority level
	// of the semaphore's Config.Levels: the request then waits for a slot,
	// up to FlowWait, as a waiter of its level
	// ([pglimitsem.Semaphore.WaitLevel]), within its level's guarantee and
	// ceiling. An error, or a level the semaphore does not have, is a 400
	// as a bad key is. Not with FlowFunc. Defaults to nil.
	LevelFunc func(r *http.Request) (string, error)

	// FlowWait, with FlowFunc or LevelFunc, bounds how long a request
	// waits for its slot (besides the request's own context); past it the
	// request is refused as a busy one is, with a Retry-After of the
	// semaphore's HoldTime, as is one whose flow's queue is full. Defaults
	// to 10s.
	FlowWait time.Duration

	// CostHeader names the response header in which a handler may report
	// the real cost for Settle, such as "X-Cost". It reaches the client as
	// the handler sets it. Defaults to "": only SetCost reports one.
	CostHeader string

	// IdempotencyKey, when true, gives each request's decision the id its
	// Idempotency-Key header carries (IETF draft-ietf-httpapi-idempotency-
	// key-header; [pglimit.WithID]): a retry of a request with the same
	// key, on any instance, within the limiter's IDRetention, is charged
	// nothing and answered with the first decision. The value is the
	// draft's quoted string (sf-string), or for clients that send one
	// bare, the value as it is; a value that is not a valid id
	// ([pglimit.ValidateID]), or a header given twice, is a 400 that
	// charges nothing. A request without the header is decided as usual.
	// Only the charge is idempotent, not the handler: it runs for the
	// retry too. A request a middleware inside this one answers is given
	// back by its id ([pglimit.RefundID]), and with Settle a request is
	// settled by its id ([pglimit.SettleID]); a retry is replayed,
	// charged nothing and not settled. With MaxDelay, a held request whose
	// client goes away keeps its slot, and its retry is held only for what
	// is left of it ([pglimit.WaitAtMost]). Middleware and Levels (the id
	// at every level: [pglimit.AllowAll]), not Concurrency. Defaults to
	// false.
	IdempotencyKey bool
}

// ErrInvalidConfig reports a [Config] that cannot be used; the message names
// the field.
var ErrInvalidConfig = errors.New("pglimithttp: invalid config")

// Middleware returns a middleware that asks lim before every request and
// advertises lim's limits in the RateLimit headers.
//
// Inside another middleware of this package, a request it answers itself
// is charged by neither, and the RateLimit headers carry both
// middlewares' policies (package doc, "Stacking middlewares").
func Middleware(lim pglimit.Limiter, cfg *Config) (func(http.Handler) http.Handler, error) {
	if lim == nil {
		return nil, fmt.Errorf("%w: limiter is nil", ErrInvalidConfig)
	}
	g, err := newGate(cfg)
	if err != nil {
		return nil, err
	}
	if err := noFlow(cfg); err != nil {
		return nil, err
	}
	p := lim.Policy()
	if len(p.Limits) == 0 {
		return nil, fmt.Errorf("%w: the limiter's policy has no limits", ErrInvalidConfig)
	}
	// pglimit validates its names; a Limiter of another make might not,
	// and its names end up in headers.
	for i, l := range p.Limits {
		if err := validatePolicy(l.Name); err != nil {
			return nil, fmt.Errorf("%w: limiter's Limits[%d].Name: %w", ErrInvalidConfig, i, err)
		}
	}
	if g.cfg.MaxDelay < 0 {
		return nil, fmt.Errorf("%w: MaxDelay: must not be negative, got %s", ErrInvalidConfig, g.cfg.MaxDelay)
	}
	for i, l := range p.Limits {
		if g.cfg.MaxDelay > 0 && l.Algorithm != pglimit.GCRA {
			return nil, fmt.Errorf("%w: MaxDelay holds requests for GCRA limits only; limiter's Limits[%d] (%q) is %s", ErrInvalidConfig, i, l.Name, l.Algorithm)
		}
	}
	m := newMiddleware(g, lim, p.Limits, []string{p.Namespace})
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(w, r, next)
		})
	}, nil
}

// newMiddleware is the middleware of g over limits (lim's, or several
// levels' for Levels, with lim nil) of namespaces: its headers and its
// answers when the limiter fails.
func newMiddleware(g gate, lim pglimit.Limiter, limits []pglimit.Limit, namespaces []string) *middleware {
	p := pglimit.Policy{Limits: limits}
	m := &middleware{gate: g, lim: lim, limits: limits, policy: formatPolicy(limits), longest: p.LongestWait(), namespaces: namespaces}
	m.longestName = limits[0].Name
	m.unavailable = limits[0].Period / time.Duration(limits[0].Rate)
	for _, l := range limits {
		m.unavailable = min(m.unavailable, l.Period/time.Duration(l.Rate))
	}
	for _, l := range limits {
		if (pglimit.Policy{Limits: []pglimit.Limit{l}}).LongestWait() == m.longest {
			m.longestName = l.Name
			break
		}
	}
	return m
}

type middleware struct {
	gate
	lim    pglimit.Limiter
	limits []pglimit.Limit
	policy string // the RateLimit-Policy field value, the same on every response
	// namespaces are the limiters' namespaces, which a 429 names: the
	// limiter's, or every level's for a fail-closed refusal of Levels.
	namespaces []string
	// longest is the longest any limit makes a key wait, longestName the
	// first limit that does: a fail-closed refusal's.
	longest     time.Duration
	longestName string
	unavailable time.Duration // Retry-After of a 503
}

type decisionKey struct{}

// DecisionFrom returns the decision the middleware made for the request
// whose context is ctx, as the handler and [Config.OnRefused] see it. It
// reports false when there was none: an exempt request, or a limiter
// failure answered by the error policy.
func DecisionFrom(ctx context.Context) (pglimit.Decision, bool) {
	d, ok := ctx.Value(decisionKey{}).(pglimit.Decision)
	return d, ok
}

func withDecision(r *http.Request, d pglimit.Decision) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), decisionKey{}, d))
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, ok := m.keyOf(w, r, next)
	if !ok {
		return
	}
	var err error
	cost := 1
	if m.cfg.CostFunc != nil {
		if cost, err = m.cfg.CostFunc(r); err != nil {
			m.badCost(w, r, key, fmt.Errorf("%w: CostFunc: %w", pglimit.ErrInvalidCost, err))
			return
		}
	}

	ctx, id, ok := m.decisionID(w, r, key)
	if !ok {
		return
	}
	var d pglimit.Decision
	if m.cfg.MaxDelay > 0 {
		d, err = pglimit.WaitAtMost(ctx, m.lim, key, cost, m.cfg.MaxDelay)
	} else {
		d, err = m.lim.AllowN(ctx, key, cost)
	}
	h := w.Header()
	switch {
	case errors.Is(err, pglimit.ErrInvalidCost):
		// Validated before the database: nothing was consumed.
		m.badCost(w, r, key, err)
	case err != nil && errors.Is(err, context.Canceled) && errors.Is(r.Context().Err(), context.Canceled):
		m.report(r, Event{Key: key, Cost: cost, Outcome: OutcomeCanceled, Err: err})
		clientGone(w, r)
	case err != nil:
		m.fail(w, r, next, key, cost, err)
	case d.Allowed:
		outcome := OutcomeAdmitted
		if d.Shadow {
			outcome = OutcomeShadowed
		}
		m.report(r, Event{Key: key, Cost: cost, Outcome: outcome, Decision: d})
		r, s := stackOf(r)
		s.admit(h, m.policy, formatRateLimit(m.binding(d.Limit), d.Remaining, ceilSeconds(d.ResetAfter)))
		r = withDecision(r, d)
		var rc *realCost
		if m.cfg.Settle {
			r, rc = withCost(r)
		}
		next.ServeHTTP(w, r)
		switch {
		case s.answeredInside():
			m.giveBackID(r, m.lim, id, d)
		case rc != nil:
			m.settle(w, r, m.lim, id, d, rc)
		}
	default:
		m.report(r, Event{Key: key, Cost: cost, Outcome: OutcomeRefused, Decision: d})
		names := make([]string, 0, 1)
		for _, l := range d.Violated() {
			names = append(names, l.Name)
		}
		if len(names) == 0 {
			names = append(names, m.binding(d.Limit))
		}
		m.refuse(w, withDecision(r, d), m.binding(d.Limit), d.Remaining, d.RetryAfter, d.ResetAfter, names, m.namespaces)
	}
}

// binding names the limit a decision reports, the first of the policy's
// when a limiter of another make leaves it unnamed.
func (m *middleware) binding(l pglimit.Limit) string {
	return cmp.Or(l.Name, m.limits[0].Name)
}

func (m *middleware) badCost(w http.ResponseWriter, r *http.Request, key string, err error) {
	m.report(r, Event{Key: key, Outcome: OutcomeBadCost, Err: err})
	answer(w, r, "")
	writeProblem(w, http.StatusBadRequest, problem{
		Title:  "Bad Request",
		Detail: "the request's rate limit cost is not valid: " + err.Error(),
	})
}

// decisionID is r's context with the decision id its Idempotency-Key
// carries, where the middleware reads one, and the id ("" for none); it
// answers a bad key itself (400, on the request's key key), and then
// reports false.
func (m *middleware) decisionID(w http.ResponseWriter, r *http.Request, key string) (context.Context, string, bool) {
	ctx := r.Context()
	if !m.cfg.IdempotencyKey {
		return ctx, "", true
	}
	id, has, err := idempotencyKey(r.Header)
	switch {
	case err != nil:
		m.badID(w, r, key, err)
		return ctx, "", false
	case has:
		ctx = pglimit.WithID(ctx, id)
	}
	return ctx, id, true
}

// badID answers a request whose Idempotency-Key is not a valid id.
func (m *middleware) badID(w http.ResponseWriter, r *http.Request, key string, err error) {
	m.report(r, Event{Key: key, Outcome: OutcomeBadCost, Err: err})
	answer(w, r, "")
	writeProblem(w, http.StatusBadRequest, problem{
		Title:  "Bad Request",
		Detail: "the request's Idempotency-Key is not valid: " + err.Error(),
	})
}

// idempotencyKey is the id h's Idempotency-Key field carries, and whether
// it has one: the draft's sf-string, or a bare value as it is. A field
// given twice, or a value that is not a valid id, is an error wrapping
// [pglimit.ErrInvalidID].
func idempotencyKey(h http.Header) (string, bool, error) {
	values := h.Values("Idempotency-Key")
	switch {
	case len(values) == 0:
		return "", false, nil
	case len(values) > 1:
		return "", false, fmt.Errorf("%w: Idempotency-Key given %d times", pglimit.ErrInvalidID, len(values))
	}
	v := values[0]
	if strings.HasPrefix(v, `"`) {
		s, ok := sfString(v)
		if !ok {
			return "", false, fmt.Errorf("%w: Idempotency-Key %q is not a quoted string", pglimit.ErrInvalidID, v)
		}
		v = s
	}
	if err := pglimit.ValidateID(v); err != nil {
		return "", false, err
	}
	return v, true, nil
}

// sfString parses v as a structured field string (RFC 8941, 3.3.3):
// printable ASCII in double quotes, with \" and \\ its only escapes.
func sfString(v string) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v)-1 || (v[i] != '"' && v[i] != '\\') {
				return "", false
			}
			b.WriteByte(v[i])
		case c == '"' || c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// fail applies the error policy to a limiter failure.
func (m *middleware) fail(w http.ResponseWriter, r *http.Request, next http.Handler, key string, cost int, err error) {
	m.failures.Record(time.Now(), "key", key, "on_error", m.cfg.OnError, "err", err)
	switch m.cfg.OnError {
	case FailOpen:
		m.report(r, Event{Key: key, Cost: cost, Outcome: OutcomeFailOpen, Err: err})
		next.ServeHTTP(w, r)
	case FailClosed:
		m.report(r, Event{Key: key, Cost: cost, Outcome: OutcomeFailClosed, Err: err})
		// As if the limit that makes a key wait longest were exhausted.
		m.refuse(w, r, m.longestName, 0, m.longest, m.longest, []string{m.longestName}, m.namespaces)
	default:
		m.report(r, Event{Key: key, Cost: cost, Outcome: OutcomeUnavailable, Err: err})
		m.serviceUnavailable(w, r, m.unavailable)
	}
}

// refuse writes a 429 that tells the client to wait for wait, reporting the
// limit named binding with remaining units, reset after reset, and the
// limits violated of the limiters of namespaces, or hands r to OnRefused
// with those headers set.
func (m *middleware) refuse(w http.ResponseWriter, r *http.Request, binding string, remaining int, wait, reset time.Duration, violated, namespaces []string) {
	m.gate.refuse(w, r, m.policy, binding, remaining, wait, reset, violated, namespaces)
}

// refuse writes the 429 of a refusal by the policies violated, of the
// limiters of namespaces (none for a semaphore), policy being the
// RateLimit-Policy value; the rate and concurrency middlewares both answer
// with it.
//
// The body names the namespaces, so that the person on call finds the
// limiter's recorded policy (pglimit.RecordedPolicies, the pglimit
// command) from a 429 alone. A namespace is the application's
// Config.Namespace, a name it chose for the limiter (or one derived from
// the limits, which the RateLimit-Policy header states already), never a
// key: it tells a client which limiter refused it, as the policy names do.
func (g *gate) refuse(w http.ResponseWriter, r *http.Request, policy, binding string, remaining int, wait, reset time.Duration, violated, namespaces []string) {
	secs := retryAfterSeconds(wait)
	h := w.Header()
	h.Set("Retry-After", formatSeconds(secs))
	// With the policies of the middlewares outside this one, which give
	// their units back.
	h.Set("RateLimit-Policy", answer(w, r, policy))
	// t is never below Retry-After, so a client that reads only
	// RateLimit does not come back before the request can pass.
	h.Set("RateLimit", formatRateLimit(binding, remaining, max(secs, ceilSeconds(reset))))
	if g.cfg.OnRefused != nil {
		g.cfg.OnRefused.ServeHTTP(w, r)
		return
	}
	of := ""
	switch len(namespaces) {
	case 0:
	case 1:
		of = fmt.Sprintf(" of namespace %q", namespaces[0])
	default:
		q := make([]string, len(namespaces))
		for i, ns := range namespaces {
			q[i] = strconv.Quote(ns)
		}
		of = " of namespaces " + strings.Join(q, ", ")
	}
	writeProblem(w, http.StatusTooManyRequests, problem{
		Type:             quotaExceededType,
		Title:            "Too Many Requests",
		Detail:           fmt.Sprintf("refused by the %s policy%s; retry in %d s", strings.Join(violated, ", "), of, secs),
		ViolatedPolicies: violated,
		Namespaces:       namespaces,
	})
}

// gate is what the rate and concurrency middlewares share: the
// configuration, the exempt keys and the failure log.
type gate struct {
	cfg        Config
	exemptKeys map[string]bool
	failures   *onerror.Log
}

// newGate validates the fields of cfg that both middlewares use, and
// fills in their defaults.
func newGate(cfg *Config) (gate, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.KeyFunc == nil {
		c.KeyFunc, _ = RemoteIP(nil) // the defaults are valid
	}
	if c.LogInterval < 0 {
		return gate{}, fmt.Errorf("%w: LogInterval: must not be negative, got %s", ErrInvalidConfig, c.LogInterval)
	}
	switch {
	case c.CostHeader != "" && !isToken(c.CostHeader):
		return gate{}, fmt.Errorf("%w: CostHeader: %q is not a header name", ErrInvalidConfig, c.CostHeader)
	case c.CostHeader != "" && !c.Settle:
		return gate{}, fmt.Errorf("%w: CostHeader %q without Settle", ErrInvalidConfig, c.CostHeader)
	}
	exemptKeys := make(map[string]bool, len(c.ExemptKeys))
	for i, k := range c.ExemptKeys {
		if err := pglimit.ValidateKey(k); err != nil {
			return gate{}, fmt.Errorf("%w: ExemptKeys[%d]: %w", ErrInvalidConfig, i, err)
		}
		exemptKeys[k] = true
	}
	if !c.OnError.Valid() {
		return gate{}, fmt.Errorf("%w: OnError: unknown %s", ErrInvalidConfig, c.OnError)
	}
	return gate{
		cfg: c, exemptKeys: exemptKeys,
		failures: &onerror.Log{Logger: c.Logger, Interval: cmp.Or(c.LogInterval, 10*time.Second), Message: "pglimithttp: limiter failed"},
	}, nil
}

// keyOf returns the request's key. It reports false when it has answered
// the request itself: served an exempt one, or refused one with no valid
// key.
func (g *gate) keyOf(w http.ResponseWriter, r *http.Request, next http.Handler) (string, bool) {
	if g.exempt(w, r, next, "") {
		return "", false
	}
	key, ok := g.extract(w, r, g.cfg.KeyFunc)
	if !ok || g.exempt(w, r, next, key) {
		return "", false
	}
	return key, true
}

// keysOf is keyOf for one key of each of funcs: a request is exempt when
// any of its keys is.
func (g *gate) keysOf(w http.ResponseWriter, r *http.Request, next http.Handler, funcs []KeyFunc) ([]string, bool) {
	if g.exempt(w, r, next, "") {
		return nil, false
	}
	keys := make([]string, len(funcs))
	for i, f := range funcs {
		var ok bool
		if keys[i], ok = g.extract(w, r, f); !ok {
			return nil, false
		}
	}
	for _, key := range keys {
		if g.exempt(w, r, next, key) {
			return nil, false
		}
	}
	return keys, true
}

// exempt serves r, and reports true, when it is exempt: by Config.Exempt
// (key ""), or by its key, one of Config.ExemptKeys.
func (g *gate) exempt(w http.ResponseWriter, r *http.Request, next http.Handler, key string) bool {
	is := g.exemptKeys[key]
	if key == "" {
		is = g.cfg.Exempt != nil && g.cfg.Exempt(r)
	}
	if !is {
		return false
	}
	g.report(r, Event{Key: key, Outcome: OutcomeExempt})
	next.ServeHTTP(w, r)
	return true
}

// extract returns r's key by f, or answers 400 and reports false.
func (g *gate) extract(w http.ResponseWriter, r *http.Request, f KeyFunc) (string, bool) {
	key, err := f(r)
	if err == nil {
		// Checked here so that a bad key is a 400, never a database error.
		err = pglimit.ValidateKey(key)
	}
	if err != nil {
		g.report(r, Event{Key: key, Outcome: OutcomeBadKey, Err: err})
		answer(w, r, "")
		writeProblem(w, http.StatusBadRequest, problem{
			Title:  "Bad Request",
			Detail: "no valid rate limit key in the request: " + err.Error(),
		})
		return "", false
	}
	return key, true
}

// clientGone answers 499: the client went away while the limiter decided.
func clientGone(w http.ResponseWriter, r *http.Request) {
	answer(w, r, "")
	w.WriteHeader(statusClientClosedRequest)
}

// serviceUnavailable answers 503: the limiter cannot decide.
func (g *gate) serviceUnavailable(w http.ResponseWriter, r *http.Request, retryAfter time.Duration) {
	answer(w, r, "")
	// The cause stays in the server's logs (OnDecision): it names
	// hosts and SQL states a client has no business seeing.
	w.Header().Set("Retry-After", formatSeconds(retryAfterSeconds(retryAfter)))
	writeProblem(w, http.StatusServiceUnavailable, problem{
		Title:  "Service Unavailable",
		Detail: "the rate limiter cannot decide right now; try again later",
	})
}

func (g *gate) report(r *http.Request, ev Event) {
	if g.cfg.OnDecision != nil {
		g.cfg.OnDecision(r, ev)
	}
}
