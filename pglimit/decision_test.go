package pglimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// A refusal names the limits that refused it, in the limiter's order, and
// RetryAfter is the longest of their waits; an admission names none. The
// slice is the caller's.
func TestDecisionViolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: testdb.Schema(t), Limits: []pglimit.Limit{
		{Name: "roomy", Rate: 100, Period: time.Hour, Burst: 100},
		{Name: "hourly", Rate: 1, Period: time.Hour, Burst: 1},
		{Name: "daily", Algorithm: pglimit.FixedWindow, Rate: 1, Period: 24 * time.Hour},
	}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := lim.Allow(ctx, "k")
	if err != nil || !d.Allowed || d.Violated() != nil {
		t.Fatalf("first: %+v, %v; violated %v", d, err, d.Violated())
	}
	d, err = lim.Allow(ctx, "k")
	if err != nil || d.Allowed {
		t.Fatalf("second: %+v, %v; want refused", d, err)
	}
	v := d.Violated()
	if len(v) != 2 || v[0].Name != "hourly" || v[1].Name != "daily" {
		t.Fatalf("violated %+v, want hourly then daily", v)
	}
	if d.RetryAfter <= time.Hour || d.RetryAfter > 24*time.Hour {
		t.Errorf("RetryAfter %s, want the daily window's wait (more than the hour)", d.RetryAfter)
	}
	v[0].Name = "changed"
	if d.Violated()[0].Name != "hourly" || lim.Policy().Limits[1].Name != "hourly" {
		t.Error("changing the returned slice changed the decision or the policy")
	}
}
