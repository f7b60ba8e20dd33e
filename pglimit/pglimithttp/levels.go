package pglimithttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"

	"github.com/pglimit/cooldown/pglimit"
)

// Level is one level of a hierarchical limit: a limiter, and the key a
// request has under it, such as its organisation, its user or its API key.
type Level struct {
	Limiter pglimit.Limiter
	KeyFunc KeyFunc
}

// Levels returns a middleware that passes a request only if every level
// admits it, and then counts it at every level.
//
// It decides at every level at once ([pglimit.AllowAll]); a refused request
// counts at none. Its 429 names the limits that refused it, of every level
// that did, with the longest Retry-After of them. RateLimit-Policy lists
// every level's limits, whose names must differ from level to level;
// RateLimit reports the limit with the fewest units left, of any level.
//
// cfg is as for [Middleware], but each level has its own KeyFunc, so
// cfg.KeyFunc must be nil; a request is exempt when any of its keys is one
// of cfg.ExemptKeys; MaxDelay is not supported. [DecisionFrom] gives the
// handler the binding level's decision, and [DecisionsFrom] every level's.
// An Event's Key is the first level's key.
//
// One decision charges every level the same cost, and [Config.Settle]
// settles every level at the same real cost. Limits of other costs, or
// one settled and others not, are middlewares stacked around each other
// (package doc, "Stacking middlewares"): a request that one inside
// refuses is charged nothing here.
func Levels(levels []Level, cfg *Config) (func(http.Handler) http.Handler, error) {
	if len(levels) == 0 || len(levels) > pglimit.MaxLevels {
		return nil, fmt.Errorf("%w: %d levels, not in [1, %d]", ErrInvalidConfig, len(levels), pglimit.MaxLevels)
	}
	if cfg != nil && (cfg.KeyFunc != nil || cfg.MaxDelay != 0) {
		return nil, fmt.Errorf("%w: Levels: give each level its KeyFunc; Config.KeyFunc and MaxDelay must be unset", ErrInvalidConfig)
	}
	if err := noFlow(cfg); err != nil {
		return nil, err
	}
	g, err := newGate(cfg)
	if err != nil {
		return nil, err
	}
	lm := &levelsMiddleware{}
	var limits []pglimit.Limit
	names := map[string]int{}
	for i, lv := range levels {
		if lv.Limiter == nil || lv.KeyFunc == nil {
			return nil, fmt.Errorf("%w: levels[%d]: a Limiter and a KeyFunc are required", ErrInvalidConfig, i)
		}
		p := lv.Limiter.Policy()
		for j, l := range p.Limits {
			if err := validatePolicy(l.Name); err != nil {
				return nil, fmt.Errorf("%w: levels[%d]'s Limits[%d].Name: %w", ErrInvalidConfig, i, j, err)
			}
			if k, dup := names[l.Name]; dup {
				return nil, fmt.Errorf("%w: levels[%d] and levels[%d] both have a limit named %q: the RateLimit headers could not tell them apart", ErrInvalidConfig, k, i, l.Name)
			}
			names[l.Name] = i
		}
		limits = append(limits, p.Limits...)
		lm.charges = append(lm.charges, pglimit.Charge{Limiter: lv.Limiter})
		lm.namespaces = append(lm.namespaces, p.Namespace)
		lm.keys = append(lm.keys, lv.KeyFunc)
	}
	if len(limits) == 0 {
		return nil, fmt.Errorf("%w: the levels' policies have no limits", ErrInvalidConfig)
	}
	// RateLimit-Policy lists every level's limits, in the levels' order.
	lm.m = newMiddleware(g, nil, limits, lm.namespaces)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			lm.serve(w, r, next)
		})
	}, nil
}

type levelsMiddleware struct {
	m          *middleware // the headers, failures and events, over every level's limits
	charges    []pglimit.Charge
	keys       []KeyFunc
	namespaces []string // each level's limiter's
}

type decisionsKey struct{}

// DecisionsFrom returns the decisions of the levels for the request whose
// context is ctx, as [Levels] made them. It reports false when there were
// none: an exempt request, a request of another middleware, or a failure
// the error policy answered.
func DecisionsFrom(ctx context.Context) (pglimit.Decisions, bool) {
	d, ok := ctx.Value(decisionsKey{}).(pglimit.Decisions)
	return d, ok
}

func (lm *levelsMiddleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	m := lm.m
	keys, ok := m.keysOf(w, r, next, lm.keys)
	if !ok {
		return
	}
	var err error
	cost := 1
	if m.cfg.CostFunc != nil {
		if cost, err = m.cfg.CostFunc(r); err != nil {
			m.badCost(w, r, keys[0], fmt.Errorf("%w: CostFunc: %w", pglimit.ErrInvalidCost, err))
			return
		}
	}
	charges := slices.Clone(lm.charges)
	for i := range charges {
		charges[i].Key = keys[i]
	}
	ctx, id, ok := m.decisionID(w, r, keys[0])
	if !ok {
		return
	}
	ds, err := pglimit.AllowAll(ctx, cost, charges...)
	switch {
	case errors.Is(err, pglimit.ErrInvalidCost):
		m.badCost(w, r, keys[0], err)
	case err != nil && errors.Is(err, context.Canceled) && errors.Is(r.Context().Err(), context.Canceled):
		m.report(r, Event{Key: keys[0], Cost: cost, Outcome: OutcomeCanceled, Err: err})
		clientGone(w, r)
	case err != nil:
		m.fail(w, r, next, keys[0], cost, err)
	case ds.Allowed:
		// The binding level: the one with the fewest units left.
		b := slices.MinFunc(ds.Levels, func(a, b pglimit.Decision) int { return a.Remaining - b.Remaining })
		m.report(r, Event{Key: keys[0], Cost: cost, Outcome: OutcomeAdmitted, Decision: b})
		r, s := stackOf(r)
		s.admit(w.Header(), m.policy, formatRateLimit(m.binding(b.Limit), b.Remaining, ceilSeconds(b.ResetAfter)))
		r = withDecisions(r, ds, b)
		var rc *realCost
		if m.cfg.Settle {
			r, rc = withCost(r)
		}
		next.ServeHTTP(w, r)
		switch {
		case s.answeredInside():
			// At once, so that the answer waits one Timeout at most.
			var wg sync.WaitGroup
			for i, d := range ds.Levels {
				wg.Go(func() { m.giveBackID(r, lm.charges[i].Limiter, id, d) })
			}
			wg.Wait()
		case rc != nil:
			for i, d := range ds.Levels {
				m.settle(w, r, lm.charges[i].Limiter, id, d, rc)
			}
		}
	default:
		// The binding level: the refusing one with the longest wait.
		var b pglimit.Decision
		var violated, namespaces []string
		for i, d := range ds.Levels {
			if d.Allowed {
				continue
			}
			if d.RetryAfter >= b.RetryAfter {
				b = d
			}
			namespaces = append(namespaces, lm.namespaces[i])
			for _, l := range d.Violated() {
				violated = append(violated, l.Name)
			}
		}
		if len(violated) == 0 {
			violated = append(violated, m.binding(b.Limit))
		}
		m.report(r, Event{Key: keys[0], Cost: cost, Outcome: OutcomeRefused, Decision: b})
		m.refuse(w, withDecisions(r, ds, b), m.binding(b.Limit), b.Remaining, ds.RetryAfter, b.ResetAfter, violated, namespaces)
	}
}

func withDecisions(r *http.Request, ds pglimit.Decisions, binding pglimit.Decision) *http.Request {
	ctx := context.WithValue(r.Context(), decisionsKey{}, ds)
	return r.WithContext(context.WithValue(ctx, decisionKey{}, binding))
}
