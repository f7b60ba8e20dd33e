package pglimithttp

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// stack is what the middlewares of this package that one request passes
// through share, outermost first: the RateLimit fields of those that
// admitted it, and whether one inside them answered the request itself.
// The first of them puts it in the request's context; the others find it
// there. It is never a request's own status that tells a refusal, so an
// application's 429 is no middleware's.
type stack struct {
	mu       sync.Mutex
	policies []string // the RateLimit-Policy values of the layers that admitted the request
	items    []string // their RateLimit items, "" for none (Concurrency)
	answered bool     // a middleware answered the request instead of passing it on
}

type stackKey struct{}

// stackOf returns the stack of r, and r with it in its context: a new one
// when no middleware of this package is outside this one.
func stackOf(r *http.Request) (*http.Request, *stack) {
	if s, ok := r.Context().Value(stackKey{}).(*stack); ok {
		return r, s
	}
	s := &stack{}
	return r.WithContext(context.WithValue(r.Context(), stackKey{}, s)), s
}

// admit records a layer that admitted the request, and sets the RateLimit
// fields to every admitting layer's, outermost first: RateLimit-Policy
// lists their policies and RateLimit each one's binding limit, since their
// units (requests, bytes, slots) cannot be compared. item is "" for a
// layer that reports none.
func (s *stack) admit(h http.Header, policy, item string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.policies = append(s.policies, policy)
	s.items = append(s.items, item)
	h.Set("RateLimit-Policy", strings.Join(s.policies, ", "))
	var items []string
	for _, it := range s.items {
		if it != "" {
			items = append(items, it)
		}
	}
	if len(items) > 0 {
		h.Set("RateLimit", strings.Join(items, ", "))
	}
}

// answer records that a middleware answered r itself (a refusal, a bad
// key or cost, an outage, a client gone), so that the layers outside it
// give back what they charged, and returns the RateLimit-Policy value to
// send with policy, the answering layer's ("" for none): the outer
// layers' policies still apply. Their RateLimit items no longer hold
// once they give their units back, so the field is removed; a 429 sets
// its own.
func answer(w http.ResponseWriter, r *http.Request, policy string) string {
	s, ok := r.Context().Value(stackKey{}).(*stack)
	if !ok {
		return policy
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answered = true
	w.Header().Del("RateLimit")
	all := s.policies
	if policy != "" {
		all = append(all[:len(all):len(all)], policy)
	}
	v := strings.Join(all, ", ")
	if v != "" {
		w.Header().Set("RateLimit-Policy", v)
	}
	return v
}

// answeredInside reports whether a middleware inside the one that found s
// answered the request itself; the handler did not run.
func (s *stack) answeredInside() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.answered
}

// giveBack refunds d, lim's admission of r, whose handler never ran: a
// middleware inside this one answered r itself. A refund that fails
// keeps the units charged, and is logged with the failures' rate limit;
// one that a limit declines (another admission of the key since, for
// GCRA; a window that has ended) is no error (see [pglimit.Limiter.Refund]).
func (g *gate) giveBack(r *http.Request, lim pglimit.Limiter, d pglimit.Decision) {
	g.refund(r, d, func(ctx context.Context) error {
		_, err := lim.Refund(ctx, d, d.Granted)
		return err
	})
}

// giveBackID is giveBack of d, a decision with the id id ("" for none),
// which is refunded by its id ([pglimit.RefundID]); a replayed one took
// nothing.
func (g *gate) giveBackID(r *http.Request, lim pglimit.Limiter, id string, d pglimit.Decision) {
	switch {
	case id == "":
		g.giveBack(r, lim, d)
		return
	case d.Replayed:
		return
	}
	g.refund(r, d, func(ctx context.Context) error {
		_, err := pglimit.RefundID(ctx, lim, id, d.Granted)
		return err
	})
}

// refund runs refund for d, unless d took nothing from the database, and
// logs its failure.
func (g *gate) refund(r *http.Request, d pglimit.Decision, refund func(context.Context) error) {
	if !d.Allowed || d.Shadow || d.Fallback || d.Granted <= 0 {
		return // it took nothing from the database
	}
	// The client may be gone: the refund is owed all the same, within the
	// limiter's Timeout.
	if err := refund(context.WithoutCancel(r.Context())); err != nil {
		g.failures.Record(time.Now(), "err", fmt.Errorf("refund of %d units of a request refused inside: %w", d.Granted, err))
	}
}
