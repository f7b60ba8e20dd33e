package main

import (
	"strings"
	"testing"

	"github.com/pglimit/cooldown/pglimit"
)

// An over-admission fails the run when a pglimit strategy made it; made
// by the peer or by range-naive, it is a finding in the notes and the run
// goes on to pass.
func TestOverAdmissionFailsOnlyPglimit(t *testing.T) {
	t.Parallel()
	over := func() *result {
		return &result{Scenario: "busy-key", Concurrency: 8,
			Client: &admissionCheck{Keys: 1, Admitted: 5500, MaxAllowed: 5499, OverAdmitted: 1}}
	}
	upsert := variant{Name: "upsert", Strategy: pglimit.Upsert}
	for _, tc := range []struct {
		v            variant
		fails, notes bool
	}{
		{upsert, true, false},
		{peer, false, true},
		{peerAlways, false, true},
		{naive, false, true},
		{pingFloor, false, false},
	} {
		res := over()
		f, n := failures(res, tc.v), findings(res, tc.v)
		if (len(f) > 0) != tc.fails || (len(n) > 0) != tc.notes {
			t.Errorf("%s over-admitting: failures %q, notes %q; want failures %t, notes %t", tc.v.Name, f, n, tc.fails, tc.notes)
		}
		if tc.v.Redis && tc.notes && !strings.Contains(n[0], "5500 admitted, 5499 allowed") {
			t.Errorf("%s: the note %q does not give the figures", tc.v.Name, n[0])
		}
	}
	ok := &result{Scenario: "busy-key", Client: &admissionCheck{Keys: 1, Admitted: 10, MaxAllowed: 10}}
	if f, n := failures(ok, peer), findings(ok, peer); len(f)+len(n) > 0 {
		t.Errorf("the peer within its limit: failures %q, notes %q; want none", f, n)
	}
}
