package pglimittest

import (
	"testing"
	"time"
)

func TestOverBusy(t *testing.T) {
	t.Parallel()
	origin := time.Now()
	at := func(us int) timed {
		t := origin.Add(time.Duration(us) * time.Microsecond)
		return timed{t, t}
	}
	// busyLimit: T = 500µs, burst 40.
	var even []timed
	for i := range 200 {
		even = append(even, at(i*500))
	}
	if n := overBusy(even, busyLimit); n != 0 {
		t.Errorf("one admission every T: %d over, want 0", n)
	}
	burst := append([]timed(nil), even[:40]...)
	for i := range burst {
		burst[i] = at(0)
	}
	if n := overBusy(burst, busyLimit); n != 0 {
		t.Errorf("a burst of 40 at once: %d over, want 0", n)
	}
	burst = append(burst, at(499))
	if n := overBusy(burst, busyLimit); n != 1 {
		t.Errorf("41 within 499µs: %d over, want 1", n)
	}
	// Answered late, the 41st may have been decided a full T later.
	burst[40].received = origin.Add(500 * time.Microsecond)
	if n := overBusy(burst, busyLimit); n != 0 {
		t.Errorf("41 within 500µs at the latest: %d over, want 0", n)
	}
}
