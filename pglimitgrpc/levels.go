package pglimitgrpc

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pglimit/cooldown/pglimit"
)

// Level is one level of a hierarchical limit: a limiter, and the key a
// call has under it, such as its organisation, its user or its API key.
type Level struct {
	Limiter pglimit.Limiter
	Key     KeyFunc
}

// UnaryServerLevels limits unary calls at every level at once
// ([pglimit.AllowAll]): a call passes only if every level admits it, and
// then counts at every level; a refused one counts at none and fails with
// codes.ResourceExhausted, whose QuotaFailure names the limits of every
// level that refused and whose RetryInfo is the longest wait of them. cfg
// is as for [UnaryServerInterceptor], but each level has its own key
// function, so cfg.Key and cfg.Methods must be unset. An Event's Key is
// the first level's key, and its Decision the binding level's.
//
// Limits that need a Config of their own beside the levels (per-method
// limiters, another OnError or Exempt) are interceptors chained with this
// one (package doc, "Chaining interceptors"): a call that one inside
// fails is charged nothing here.
func UnaryServerLevels(levels []Level, cfg *Config) (grpc.UnaryServerInterceptor, error) {
	l, err := newLevels(levels, cfg)
	if err != nil {
		return nil, err
	}
	return unary(l.limiter, l.decideLevels), nil
}

// StreamServerLevels limits streams as [UnaryServerLevels] limits unary
// calls: one decision when a stream opens.
func StreamServerLevels(levels []Level, cfg *Config) (grpc.StreamServerInterceptor, error) {
	l, err := newLevels(levels, cfg)
	if err != nil {
		return nil, err
	}
	return stream(l.limiter, l.decideLevels), nil
}

// levels is the state of the levels' interceptors: the limiter's, with a
// guard over every level's limits for failures.
type levels struct {
	*limiter
	charges []pglimit.Charge
	keys    []KeyFunc
}

func newLevels(lvs []Level, cfg *Config) (*levels, error) {
	if len(lvs) == 0 || len(lvs) > pglimit.MaxLevels {
		return nil, fmt.Errorf("%w: %d levels, not in [1, %d]", ErrInvalidConfig, len(lvs), pglimit.MaxLevels)
	}
	if cfg != nil && (cfg.Key != nil || len(cfg.Methods) > 0) {
		return nil, fmt.Errorf("%w: levels: give each level its Key; Config.Key and Methods must be unset", ErrInvalidConfig)
	}
	out := &levels{}
	all := &guard{}
	for i, lv := range lvs {
		g, err := newGuard(lv.Limiter)
		if err != nil {
			return nil, fmt.Errorf("%w: levels[%d]: %w", ErrInvalidConfig, i, err)
		}
		if lv.Key == nil {
			return nil, fmt.Errorf("%w: levels[%d]: Key is nil", ErrInvalidConfig, i)
		}
		all.limits = append(all.limits, g.limits...)
		all.longest = max(all.longest, g.longest)
		if all.unavailable == 0 || g.unavailable < all.unavailable {
			all.unavailable = g.unavailable
		}
		out.charges = append(out.charges, pglimit.Charge{Limiter: lv.Limiter})
		out.keys = append(out.keys, lv.Key)
	}
	all.lim = lvs[0].Limiter
	l, err := newLimiter(all.lim, cfg)
	if err != nil {
		return nil, err
	}
	l.def = all
	out.limiter = l
	return out, nil
}

// decideLevels is decide for the levels.
func (l *levels) decideLevels(ctx context.Context, method string, trailer func(metadata.MD)) ([]held, error) {
	if l.exempt[method] {
		l.report(ctx, Event{Method: method, Outcome: OutcomeExempt})
		return nil, nil
	}
	charges := make([]pglimit.Charge, len(l.charges))
	for i, c := range l.charges {
		key, err := l.keys[i](ctx, method)
		if err == nil {
			err = pglimit.ValidateKey(key)
		}
		if err != nil {
			l.report(ctx, Event{Method: method, Outcome: OutcomeBadKey, Err: err})
			return nil, status.Errorf(codes.InvalidArgument, "pglimitgrpc: the call's rate limit key of level %d: %v", i, err)
		}
		charges[i] = pglimit.Charge{Limiter: c.Limiter, Key: key}
	}
	dctx, id, err := l.decisionID(ctx, method, charges[0].Key)
	if err != nil {
		return nil, err
	}
	ds, err := pglimit.AllowAll(dctx, 1, charges...)
	ev := Event{Method: method, Key: charges[0].Key, Err: err}
	switch {
	case err != nil && ctx.Err() != nil:
		ev.Outcome = OutcomeCanceled
		l.report(ctx, ev)
		return nil, status.FromContextError(ctx.Err()).Err()
	case err != nil:
		l.failures.Record(time.Now(), "method", method, "key", charges[0].Key, "err", err)
		ev.Outcome = failOutcome(l.onError)
		l.report(ctx, ev)
		return nil, l.fail(l.def, trailer)
	case ds.Allowed:
		ev.Outcome, ev.Decision = OutcomeAdmitted, ds.Levels[0]
		for _, d := range ds.Levels {
			if d.Remaining < ev.Decision.Remaining {
				ev.Decision = d
			}
		}
		l.report(ctx, ev)
		var took []held
		for i, d := range ds.Levels {
			if id != "" {
				took = holdsID(took, charges[i].Limiter, id, d)
			} else {
				took = holds(took, charges[i].Limiter, d)
			}
		}
		return took, nil
	}
	var violated []pglimit.Limit
	for _, d := range ds.Levels {
		if d.Allowed {
			continue
		}
		if d.RetryAfter >= ev.Decision.RetryAfter {
			ev.Decision = d
		}
		if v := d.Violated(); len(v) > 0 {
			violated = append(violated, v...)
		} else {
			violated = append(violated, d.Limit)
		}
	}
	ev.Outcome = OutcomeRefused
	l.report(ctx, ev)
	return nil, refusal(violated, ds.RetryAfter, trailer, nil)
}
