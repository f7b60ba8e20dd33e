package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// report posts a report of org with the Idempotency-Key key ("" for none).
func (b *testBundle) report(t *testing.T, org, key string) response {
	t.Helper()
	var h http.Header
	if key != "" {
		h = http.Header{"Idempotency-Key": {key}}
	}
	return b.doWith(t, "POST", "/orgs/"+org+"/reports", "", h)
}

// An organisation's plan: 3 reports a month from its signup, a fourth as
// overage, then refusals until a credit; a retried Idempotency-Key is
// charged once; a report's tokens are settled from another endpoint by
// its id, once.
func TestReportsPlan(t *testing.T) {
	b := setup(t, nil, nil)
	if r := b.do(t, "POST", "/orgs/acme/plan", `{"time_zone": "Europe/Paris"}`); r.code != 200 || r.json(t)["allowance"] != float64(3) || r.json(t)["hard_cap"] != float64(4) {
		t.Fatalf("sign-up: %d %s", r.code, r.body)
	}
	created := func(key string, replayed, overage, credit bool) {
		t.Helper()
		r := b.report(t, "acme", key)
		v := r.json(t)
		if r.code != 201 || v["id"] != key || v["replayed"] != replayed || v["overage"] != overage || v["credit"] != credit {
			t.Fatalf("report %s: %d %s; want 201, replayed %t, overage %t, credit %t", key, r.code, r.body, replayed, overage, credit)
		}
	}
	created("k1", false, false, false)
	created("k1", true, false, false)
	created("k2", false, false, false)
	created("k3", false, false, false)
	created("k4", false, true, false)
	if r := b.report(t, "acme", "k5"); r.code != 429 || !strings.Contains(string(r.body), "period ends") {
		t.Fatalf("k5 past the hard cap: %d %s, want 429", r.code, r.body)
	}
	if r := b.do(t, "POST", "/orgs/acme/credits", `{"units": 1, "expires_in": "1h"}`); r.code != 200 || r.json(t)["credits_left"] != float64(1) {
		t.Fatalf("grant: %d %s", r.code, r.body)
	}
	created("k5", false, false, true)
	if r := b.do(t, "GET", "/orgs/acme/usage", ""); r.code != 200 || r.json(t)["used"] != float64(5) || r.json(t)["overage"] != float64(1) {
		t.Fatalf("usage: %d %s, want 5 used, 1 overage", r.code, r.body)
	}

	// k1 spent 500 tokens of its 2,000 estimate; k5, refused once, kept
	// its estimate for its retry, which charged nothing more.
	if r := b.do(t, "POST", "/reports/k1/done", `{"tokens": 500}`); r.code != 200 || r.json(t)["returned"] != float64(1500) {
		t.Fatalf("k1 done: %d %s, want 1500 returned", r.code, r.body)
	}
	if r := b.do(t, "POST", "/reports/k1/done", `{"tokens": 500}`); r.code != 409 {
		t.Fatalf("k1 done twice: %d %s, want 409", r.code, r.body)
	}
	if r := b.do(t, "POST", "/reports/nope/done", `{"tokens": 1}`); r.code != 404 {
		t.Fatalf("an unknown report done: %d %s, want 404", r.code, r.body)
	}
	tokens, err := pglimit.New(b.pool, &pglimit.Config{Schema: b.schema, Namespace: "report-tokens",
		Limits: []pglimit.Limit{{Name: "tokens", Rate: reportTokensPerHour, Period: time.Hour, Burst: reportTokensPerHour, Debt: reportTokensPerHour / 2}}})
	if err != nil {
		t.Fatal(err)
	}
	// Five estimates of 2,000, k1's settled at 500: 8,500 spent, less the
	// 28 a second that come back (300: a slow machine's ten seconds).
	if d, err := tokens.Peek(t.Context(), "acme", 1); err != nil || d.Remaining < reportTokensPerHour-8_500-1 || d.Remaining > reportTokensPerHour-8_500+300 {
		t.Fatalf("tokens left: %+v, %v; want about %d", d, err, reportTokensPerHour-8_500)
	}

	for _, bad := range []struct{ method, path, body string }{
		{"POST", "/orgs/acme/plan", `{"time_zone": "Mars/Olympus"}`},
		{"POST", "/orgs/acme/plan", `{"time_zone": "Local"}`},
		{"POST", "/orgs/acme/credits", `{"units": 0, "expires_in": "1h"}`},
		{"POST", "/orgs/acme/credits", `{"units": 1, "expires_in": "-1h"}`},
		{"POST", "/orgs/acme/credits", `{"units": 1}`},
		{"POST", "/orgs/acme/credits", `{"units": 1, "expires_in": "1h", "extra": 1}`},
		{"POST", "/reports/k2/done", `{"tokens": -1}`},
		{"GET", "/orgs/" + strings.Repeat("x", maxUserBytes+1) + "/usage", ""},
	} {
		if r := b.do(t, bad.method, bad.path, bad.body); r.code != 400 {
			t.Errorf("%s %s %s: %d %s, want 400", bad.method, bad.path, bad.body, r.code, r.body)
		}
	}
	if r := b.report(t, "acme", strings.Repeat("k", pglimit.MaxIDLength+1)); r.code != 400 {
		t.Errorf("a report with a key too long: %d %s, want 400", r.code, r.body)
	}
	if r := b.do(t, "GET", "/orgs/acme/usage", ""); r.code != 200 || r.json(t)["used"] != float64(5) || r.json(t)["credits_left"] != float64(0) {
		t.Fatalf("usage after bad input: %d %s, want it unchanged", r.code, r.body)
	}
}

// Without an Idempotency-Key every report is new, and one the plan
// refuses gives its tokens back: no retry can replay them.
func TestReportsWithoutKey(t *testing.T) {
	b := setup(t, nil, func(c *config) { c.reportsPerMonth, c.reportsHardCap = 1, 1 })
	if r := b.report(t, "beta", ""); r.code != 201 || !strings.HasPrefix(r.json(t)["id"].(string), "report-") {
		t.Fatalf("first report: %d %s", r.code, r.body)
	}
	if r := b.report(t, "beta", ""); r.code != 429 {
		t.Fatalf("second report on a plan of one: %d %s, want 429", r.code, r.body)
	}
	tokens, err := pglimit.New(b.pool, &pglimit.Config{Schema: b.schema, Namespace: "report-tokens",
		Limits: []pglimit.Limit{{Name: "tokens", Rate: reportTokensPerHour, Period: time.Hour, Burst: reportTokensPerHour, Debt: reportTokensPerHour / 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := tokens.Peek(t.Context(), "beta", 1); err != nil || d.Remaining < reportTokensPerHour-reportTokenEstimate-1 || d.Remaining > reportTokensPerHour-reportTokenEstimate+300 {
		t.Fatalf("tokens left: %+v, %v; want one estimate spent", d, err)
	}
}
