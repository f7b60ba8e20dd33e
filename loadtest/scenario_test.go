package main

import (
	"bytes"
	"slices"
	"testing"
)

// TestAudit checks that -audit records the admissions of every scenario,
// and that without it the throughput scenarios record none.
func TestAudit(t *testing.T) {
	t.Parallel()
	throughput := []string{scManyKeys, scCostKeys, scCostHot}
	for _, audit := range []bool{false, true} {
		args := []string{}
		if audit {
			args = append(args, "-audit")
		}
		o, err := parseOptions(args, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		for _, sc := range buildScenarios(o) {
			if want := audit || !slices.Contains(throughput, sc.Name); sc.Audit != want {
				t.Errorf("-audit=%t: %s audits: %t, want %t", audit, sc.Name, sc.Audit, want)
			}
		}
	}
}
