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
	throughput := []string{scManyKeys, scCostKeys, scCostHot, scTiers}
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

// TestTiersLevels checks the tiers scenario's workers: 1, 8 and 64, or
// -concurrency.
func TestTiersLevels(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want []int
	}{
		{nil, []int{1, 8, 64}},
		{[]string{"-short"}, []int{1, 8, 64}},
		{[]string{"-concurrency", "4,16"}, []int{4, 16}},
	} {
		o, err := parseOptions(append([]string{"-scenarios", scTiers}, tt.args...), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		scs := buildScenarios(o)
		if len(scs) != 1 || !slices.Equal(scs[0].Levels, tt.want) || scs[0].Keys != 100_000 || !scs[0].RoundRobin {
			t.Errorf("%q: %+v, want levels %v on 100,000 keys in turn", tt.args, scs, tt.want)
		}
	}
}

// TestRoundRobinKeys checks the key walk of the tiers scenario: every key
// once before any twice, and each run from the first key.
func TestRoundRobinKeys(t *testing.T) {
	t.Parallel()
	sc := scenario{Keys: 3, RoundRobin: true}
	for range 2 {
		next := sc.keyFunc("p-")
		var got []string
		for range 7 {
			got = append(got, next(nil))
		}
		if want := []string{"p-u0", "p-u1", "p-u2", "p-u0", "p-u1", "p-u2", "p-u0"}; !slices.Equal(got, want) {
			t.Errorf("keys %q, want %q", got, want)
		}
	}
}
