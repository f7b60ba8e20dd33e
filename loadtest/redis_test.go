package main

import (
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"

	"github.com/pglimit/cooldown/pglimit"
)

// TestPeerLimits checks how redis_rate is given limits: a GCRA limit as it
// is, on the key itself when alone; several on keys of their own, a window
// as GCRA with a burst of its rate.
func TestPeerLimits(t *testing.T) {
	t.Parallel()
	one := peerLimits([]pglimit.Limit{{Name: "rate", Rate: 5000, Period: time.Second, Burst: 500}})
	if len(one) != 1 || one[0] != (peerLimit{limit: redis_rate.Limit{Rate: 5000, Period: time.Second, Burst: 500}}) {
		t.Errorf("one GCRA limit: %+v", one)
	}
	want := []peerLimit{
		{limit: redis_rate.Limit{Rate: 5, Period: time.Minute, Burst: 3}, suffix: ":minute"},
		{limit: redis_rate.Limit{Rate: 1000, Period: 24 * time.Hour, Burst: 1000}, suffix: ":day"},
	}
	got := peerLimits(tiersLimits)
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("the tiers limits: %+v, want %+v", got, want)
	}
}
