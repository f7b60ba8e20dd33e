package pglimithttp

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// realCost is an admitted request's real cost, as its handler reports it
// with SetCost.
type realCost struct {
	mu   sync.Mutex
	cost int
	set  bool
}

type costKey struct{}

// SetCost records cost as the real cost of the request whose context is
// ctx, for the middleware to settle its admission at.
//
// Once the handler returns, a middleware with [Config.Settle] settles the
// request's admission at cost ([pglimit.Settle]), giving back what the
// estimate (CostFunc's) exceeded it by or charging the excess. The last
// call counts. SetCost reports false when ctx is not that of a request
// such a middleware admitted, and records nothing then.
func SetCost(ctx context.Context, cost int) bool {
	rc, ok := ctx.Value(costKey{}).(*realCost)
	if !ok {
		return false
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.cost, rc.set = cost, true
	return true
}

// withCost is r with a place for its real cost (SetCost's) in its context.
func withCost(r *http.Request) (*http.Request, *realCost) {
	rc := &realCost{}
	return r.WithContext(context.WithValue(r.Context(), costKey{}, rc)), rc
}

// settle settles d, lim's admission of r, at the real cost the handler
// reported: through SetCost, else in the response header CostHeader. A
// cost it cannot use, or a settle that fails, leaves the estimate charged
// and is logged (with the failures' rate limit). A decision with the id
// id ("" for none) is settled by its id ([pglimit.SettleID]); a replayed
// one charged nothing, and its first request settles.
func (g *gate) settle(w http.ResponseWriter, r *http.Request, lim pglimit.Limiter, id string, d pglimit.Decision, rc *realCost) {
	if d.Shadow || d.Fallback || d.Replayed {
		return // it took nothing from the database
	}
	rc.mu.Lock()
	cost, set := rc.cost, rc.set
	rc.mu.Unlock()
	if !set && g.cfg.CostHeader != "" {
		v := w.Header().Get(g.cfg.CostHeader)
		if v == "" {
			return
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			g.failures.Record(time.Now(), "err", fmt.Errorf("%w: the handler's %s header %q is not a cost", pglimit.ErrInvalidCost, g.cfg.CostHeader, v))
			return
		}
		cost, set = n, true
	}
	if !set {
		return
	}
	// The client may be gone: the settle is owed all the same, within the
	// limiter's Timeout.
	settle := func(ctx context.Context) (pglimit.Settlement, error) { return pglimit.Settle(ctx, lim, d, cost) }
	if id != "" {
		settle = func(ctx context.Context) (pglimit.Settlement, error) { return pglimit.SettleID(ctx, lim, id, cost) }
	}
	if _, err := settle(context.WithoutCancel(r.Context())); err != nil {
		g.failures.Record(time.Now(), "err", fmt.Errorf("settle at cost %d: %w", cost, err))
	}
}
