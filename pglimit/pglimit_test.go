package pglimit_test

import (
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

func TestPolicyLongestWait(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		limits []pglimit.Limit
		want   time.Duration
	}{
		{"none", nil, 0},
		{"cooldown", []pglimit.Limit{{Rate: 1, Period: 2 * time.Second, Burst: 1}}, 2 * time.Second},
		{"gcra burst", []pglimit.Limit{{Rate: 5, Period: time.Minute, Burst: 3}}, 36 * time.Second},
		{"fixed window", []pglimit.Limit{{Rate: 20, Period: time.Hour, Algorithm: pglimit.FixedWindow}}, time.Hour},
		{"sliding window", []pglimit.Limit{{Rate: 20, Period: time.Hour, Algorithm: pglimit.SlidingWindow}}, 2 * time.Hour},
		{"several", []pglimit.Limit{
			{Rate: 5, Period: time.Minute, Burst: 3},
			{Rate: 20, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
		}, 24 * time.Hour},
	} {
		if got := (pglimit.Policy{Limits: tt.limits}).LongestWait(); got != tt.want {
			t.Errorf("%s: LongestWait() = %s, want %s", tt.name, got, tt.want)
		}
	}
}
