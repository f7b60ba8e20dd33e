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

// Each run records the load average around it; the scenario's report gives
// their span and names the runs that began on a busy machine.
func TestLoadNotes(t *testing.T) {
	t.Parallel()
	res := []*result{
		{Variant: "upsert", Concurrency: 8, LoadStart: 0.5, LoadEnd: 3.1},
		{Variant: "redis_rate", Concurrency: 64, LoadStart: 2.5, LoadEnd: 4},
	}
	if got, want := loadSpan(res), "0.50-2.50 as the runs started, 3.10-4.00 as they ended"; !strings.Contains(got, want) {
		t.Errorf("loadSpan: %q, want it to contain %q", got, want)
	}
	if got := busyRuns(res, 2); got != "redis_rate at concurrency 64 (2.50)" {
		t.Errorf("busyRuns on 2 cores: %q", got)
	}
	if got := busyRuns(res, 4); got != "" {
		t.Errorf("busyRuns on 4 cores: %q, want none", got)
	}
	if got := loadSpan([]*result{{Variant: "upsert"}}); got != "" {
		t.Errorf("loadSpan without load figures: %q, want none", got)
	}
}
