package pglimit_test

import (
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// The helpers are GCRA limits of n per period with a burst of n.
func TestPerHelpers(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		got    pglimit.Limit
		period time.Duration
	}{
		{pglimit.PerSecond(5), time.Second},
		{pglimit.PerMinute(5), time.Minute},
		{pglimit.PerHour(5), time.Hour},
		{pglimit.PerDay(5), 24 * time.Hour},
	} {
		want := pglimit.Limit{Rate: 5, Period: tt.period, Burst: 5, Algorithm: pglimit.GCRA}
		if tt.got != want {
			t.Errorf("got %+v, want %+v", tt.got, want)
		}
	}
}
