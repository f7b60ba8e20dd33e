package pglimitsem_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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

// BenchmarkWaitFlow is what fair share costs: with a free slot, a Wait
// (joining the queue, then taking the slot: two statements), a WaitFlow
// (one statement with no one waiting; with places queued, a probe, then
// its join and first try in one) and a plain Acquire, each followed by a
// Release, taking
// turns so that the load of the machine falls on all three alike. It
// reports the median of each acquisition, and of WaitFlow over Wait and
// over Acquire. queued is how many live places of other flows (one each,
// behind the benchmark's waiter) the key's queue holds, which the fair
// statement reads.
func BenchmarkWaitFlow(b *testing.B) {
	for _, queued := range []int{0, 100} {
		b.Run(fmt.Sprintf("queued=%d", queued), func(b *testing.B) {
			ctx := context.Background()
			pool := testdb.Pool(b)
			schema := testdb.Schema(b)
			sem := newSemaphore(b, pool, pglimitsem.Config{Schema: schema, Namespace: "bench", Slots: 1, TTL: time.Minute})
			q := fmt.Sprintf(`INSERT INTO %s (namespace, key, arrived, waiter, expires_at, flow, weight)
				SELECT 'bench', 'k', 9000000000000000 + g, gen_random_uuid(), clock_timestamp() + interval '1 hour', 'other-' || g, 1
				FROM generate_series(1, $1::int) AS g`, pgx.Identifier{schema, "pglimit_slot_waiters"}.Sanitize())
			if _, err := pool.Exec(ctx, q, queued); err != nil {
				b.Fatal(err)
			}
			calls := []func() (pglimitsem.Slot, error){
				func() (pglimitsem.Slot, error) { return sem.Acquire(ctx, "k") },
				func() (pglimitsem.Slot, error) { return sem.Wait(ctx, "k") },
				func() (pglimitsem.Slot, error) {
					return sem.WaitFlow(ctx, "k", pglimitsem.Flow{Name: "mine", Weight: 2})
				},
			}
			took := make([][]time.Duration, len(calls))
			for i := 0; b.Loop(); i++ {
				start := time.Now()
				slot, err := calls[i%3]()
				if err != nil || !slot.Acquired {
					b.Fatalf("call %d: %+v, %v", i%3, slot, err)
				}
				took[i%3] = append(took[i%3], time.Since(start))
				if err := sem.Release(ctx, slot); err != nil {
					b.Fatal(err)
				}
			}
			var p50 [3]float64
			for i, name := range []string{"acquire", "wait", "waitflow"} {
				if len(took[i]) == 0 {
					return
				}
				slices.Sort(took[i])
				p50[i] = float64(took[i][len(took[i])/2].Nanoseconds()) / 1000
				b.ReportMetric(p50[i], "µs/"+name+"-p50")
			}
			b.ReportMetric(p50[2]/p50[1], "waitflow/wait")
			b.ReportMetric(p50[2]/p50[0], "waitflow/acquire")
		})
	}
}
