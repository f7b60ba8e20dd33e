package pglimitsem_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// BenchmarkAcquireRelease is the path without waiters: an Acquire and a
// Release of a key no one waits for, a round trip each, taking turns
// between a semaphore that polls only and one with Config.Listen, whose
// release looks for waiters to notify. Besides the mean of a pair it
// reports the median of each call of each, which a loaded machine's
// stalls move less, and which the turns expose to the same load.
func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	pool := testdb.Pool(b)
	cfg := pglimitsem.Config{Schema: testdb.Schema(b), Slots: 1, TTL: time.Minute}
	listening := cfg
	listening.Listen = pool.Config().ConnConfig
	sems := []*pglimitsem.Semaphore{newSemaphore(b, pool, cfg), newSemaphore(b, pool, listening)}
	var acquires, releases [2][]time.Duration
	for i := 0; b.Loop(); i++ {
		sem := sems[i%2]
		start := time.Now()
		slot, err := sem.Acquire(ctx, "k")
		if err != nil || !slot.Acquired {
			b.Fatalf("Acquire: %+v, %v", slot, err)
		}
		acquired := time.Now()
		if err := sem.Release(ctx, slot); err != nil {
			b.Fatal(err)
		}
		acquires[i%2], releases[i%2] = append(acquires[i%2], acquired.Sub(start)), append(releases[i%2], time.Since(acquired))
	}
	for i, name := range []string{"poll", "listen"} {
		for _, m := range []struct {
			call string
			d    []time.Duration
		}{{"acquire", acquires[i]}, {"release", releases[i]}} {
			if len(m.d) == 0 {
				continue
			}
			slices.Sort(m.d)
			b.ReportMetric(float64(m.d[len(m.d)/2].Nanoseconds())/1000, "µs/"+m.call+"-"+name+"-p50")
		}
	}
}
