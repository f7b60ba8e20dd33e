package pglimithttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
)

// A handler reports a request's real cost through SetCost or the
// CostHeader, over a real server on loopback; the middleware settles the
// admission at it, giving back or charging into the debt. A request that
// reports none, or a cost that is not one, keeps its estimate.
func TestSettleFromResponse(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	cfg := pglimit.Config{Schema: testdb.Schema(t), Limits: []pglimit.Limit{{Name: "tokens", Rate: 100, Period: time.Hour, Algorithm: pglimit.FixedWindow, Debt: 50}}}
	lim, err := pglimit.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimithttp.Middleware(lim, &pglimithttp.Config{
		KeyFunc:    pglimithttp.FromHeader("X-User"),
		CostFunc:   func(r *http.Request) (int, error) { return strconv.Atoi(r.URL.Query().Get("estimate")) },
		Settle:     true,
		CostHeader: "X-Cost",
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch q.Get("via") {
		case "SetCost":
			n, _ := strconv.Atoi(q.Get("used"))
			if !pglimithttp.SetCost(r.Context(), n) {
				t.Errorf("SetCost in an admitted request's handler reported false")
			}
		case "header":
			w.Header().Set("X-Cost", q.Get("used"))
		}
		io.WriteString(w, "ok") //nolint:errcheck // the test reads the status
	})))
	t.Cleanup(srv.Close)
	get := func(query string, status int) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/?"+query, nil)
		req.Header.Set("X-User", "bob")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != status {
			t.Fatalf("%s: status %d, want %d", query, resp.StatusCode, status)
		}
	}
	used := func() int {
		t.Helper()
		st, err := pglimit.Inspect(context.Background(), lim, "bob")
		if err != nil {
			t.Fatal(err)
		}
		return 100 - st.Limits[0].Remaining
	}
	for _, step := range []struct {
		query  string
		status int
		used   int // Remaining is 0 in debt: 100 stands for 100 or more
	}{
		{"estimate=10&via=SetCost&used=3", 200, 3},     // 7 given back
		{"estimate=10&via=header&used=40", 200, 43},    // 30 charged
		{"estimate=5", 200, 48},                        // no cost reported: the estimate
		{"estimate=5&via=header&used=abc", 200, 53},    // not a cost: the estimate
		{"estimate=5&via=header&used=-4", 200, 58},     // not a cost: the estimate
		{"estimate=10&via=SetCost&used=500", 200, 100}, // 490 past: 82 charged, to 150
		{"estimate=1&via=SetCost&used=0", 429, 100},    // in debt: refused, no settle
	} {
		get(step.query, step.status)
		if got := used(); got != step.used {
			t.Fatalf("after %s: %d used, want %d", step.query, got, step.used)
		}
	}
	// The window counts the debt: 100 and the cap's 50.
	var count int
	if err := pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT state[2] FROM %q.pglimit_upsert WHERE key = 'bob'`, cfg.Schema)).Scan(&count); err != nil || count != 150 {
		t.Errorf("the window counts %d (%v), want 150", count, err)
	}
	if pglimithttp.SetCost(context.Background(), 1) {
		t.Errorf("SetCost outside a settling middleware reported true")
	}
	for _, bad := range []pglimithttp.Config{{CostHeader: "X-Cost"}, {Settle: true, CostHeader: "X Cost"}} {
		if _, err := pglimithttp.Middleware(lim, &bad); !errors.Is(err, pglimithttp.ErrInvalidConfig) {
			t.Errorf("Middleware(%+v): %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// Through Levels, every level is settled at the handler's real cost.
func TestSettleLevels(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	orgCfg := pglimit.Config{Schema: schema, Namespace: "org", Limits: []pglimit.Limit{{Name: "org", Rate: 10, Period: time.Hour, Burst: 10, Debt: 5}}}
	userCfg := pglimit.Config{Schema: schema, Namespace: "user", Limits: []pglimit.Limit{{Name: "user", Rate: 5, Period: time.Hour, Algorithm: pglimit.FixedWindow}}}
	org, err := pglimit.New(pool, &orgCfg)
	if err != nil {
		t.Fatal(err)
	}
	user, err := pglimit.New(pool, &userCfg)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pglimithttp.Levels([]pglimithttp.Level{
		{Limiter: org, KeyFunc: pglimithttp.FromHeader("X-Org")},
		{Limiter: user, KeyFunc: pglimithttp.FromHeader("X-User")},
	}, &pglimithttp.Config{Settle: true})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { pglimithttp.SetCost(r.Context(), 4) }))
	rec := levelsGet(h, "acme", "bob")
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	// The org is charged 3 past the estimate of 1; the user, without a
	// debt, the 3 it has left.
	for _, c := range []struct {
		cfg  pglimit.Config
		key  string
		left int
	}{{orgCfg, "acme", 6}, {userCfg, "bob", 1}} {
		st, err := pglimit.Inspect(context.Background(), testdb.Limiter(t, pool, &c.cfg), c.key)
		if err != nil || st.Limits[0].Remaining != c.left {
			t.Errorf("%s after a request that cost 4: %+v, %v; want %d left", c.key, st, err, c.left)
		}
	}
}
