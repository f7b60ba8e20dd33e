package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pglimit/cooldown/pglimit"
)

// The verdict fits in 100 columns, averages a variant's rounds, names the
// default and the fastest pglimit variant against the peer, and counts
// pglimit's over-admissions, not the peer's.
func TestVerdict(t *testing.T) {
	t.Parallel()
	async := variant{Name: "upsert-async", Strategy: pglimit.Upsert, AsyncCommit: true}
	up := variant{Name: "upsert", Strategy: pglimit.Upsert}
	rep := &report{variants: map[string]variant{}}
	// Variants of other limits are not the default's rivals.
	up5k, up20k := variant{Name: "upsert-5k", Strategy: pglimit.Upsert}, variant{Name: "upsert-20k", Strategy: pglimit.Upsert}
	nowait5k := variant{Name: "nowait-5k", Strategy: pglimit.NoWait}
	for _, v := range []variant{floor, peer, up, async, naive, up5k, up20k, nowait5k} {
		rep.variants[v.Name] = v
	}
	res := func(v variant, level int, rate, peerRatio float64, over int) *result {
		return &result{Scenario: "many-keys", Variant: v.Name, Concurrency: level, Rate: rate, PeerRatio: peerRatio,
			Client: &admissionCheck{OverAdmitted: over}}
	}
	rep.Scenarios = []*scenarioReport{{Name: "many-keys", Results: []*result{
		res(floor, 8, 9000, 0, 0), res(peer, 8, 10000, 0, 3),
		res(up, 8, 5000, 0.5, 0), res(up, 8, 7000, 0.7, 0), res(async, 8, 8000, 0.8, 1),
		res(naive, 8, 9000, 0.9, 5),
		res(up, 64, 20000, 1.1, 0),
	}}, {Name: "limits", Results: []*result{res(up, 16, 9000, 0, 0)}}, {Name: "busy-key", Results: []*result{
		res(up5k, 8, 5000, 5, 0), res(up20k, 8, 20000, 20, 0), res(nowait5k, 8, 6500, 6.5, 0),
	}}}
	var b bytes.Buffer
	writeVerdict(&b, rep)
	for _, line := range strings.Split(b.String(), "\n") {
		if n := len([]rune(line)); n > 100 {
			t.Errorf("%d columns, want at most 100: %q", n, line)
		}
	}
	rows := map[string]string{}
	for _, line := range strings.Split(b.String(), "\n") {
		if f := strings.Fields(line); len(f) == 7 {
			rows[f[0]+" "+f[1]] = strings.Join(f[2:], " ")
		}
	}
	// upsert-async decided 8000/s where upsert averaged 6000/s: 1.3x, and
	// what it trades; at 64 workers only the default ran.
	if !strings.Contains(b.String(), "  many-keys, 8 workers: upsert-async, 1.3x the default, if a crash may lose the last commits") ||
		strings.Contains(b.String(), "many-keys, 64 workers") ||
		!strings.Contains(b.String(), "  busy-key, 8 workers: nowait-5k, 1.3x the default") {
		t.Errorf("the verdict does not say what to pick from the figures:\n%s", &b)
	}
	if !strings.Contains(b.String(), "× redis_rate") {
		t.Errorf("the verdict does not compare with the peer:\n%s", &b)
	}
	// At 8 workers: upsert's two rounds averaged, upsert-async the fastest,
	// its one over-admission counted, the peer's and range-naive's not.
	// Where nothing was measured to compare with, decisions per second.
	for level, want := range map[string]string{
		"many-keys 8":  "upsert 0.60 upsert-async 0.80 1",
		"many-keys 64": "upsert 1.10 upsert 1.10 0",
		"limits 16":    "upsert 9000/s upsert 9000/s 0",
		"busy-key 8":   "upsert-5k 5.00 nowait-5k 6.50 0",
	} {
		if rows[level] != want {
			t.Errorf("%s workers: %q, want %q\n%s", level, rows[level], want, &b)
		}
	}
}
