package pglimitsem_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// memoryLevels is the level of the memory tests' callers of WaitLevel.
var memoryLevels = []pglimitsem.Level{{Name: "l", Max: 1}}

// waitOrLevel is, for the i-th caller, Wait, or every other one WaitLevel.
func waitOrLevel(ctx context.Context, sem *pglimitsem.Semaphore, key string, i int) (pglimitsem.Slot, error) {
	if i%2 == 1 {
		return sem.WaitLevel(ctx, key, "l")
	}
	return sem.Wait(ctx, key)
}

// The memory bound of Wait's and WaitLevel's wake channels: on each of many distinct keys
// of one slot, a holder takes the slot, a caller waits for it, and the
// holder's Release wakes it (WaitPoll is a minute, so that nothing else
// does); once every caller has returned and released its slot, the
// semaphore keeps nothing of any key. 100,000 keys in the full tier,
// 10,000 in the quick one.
func TestMemoryIdleWaitKeys(t *testing.T) {
	keys := 100_000
	if testing.Short() {
		keys = 10_000
	}
	pcfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 16
	pcfg.ConnConfig.RuntimeParams["search_path"] = ""
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1, WaitPoll: time.Minute, Levels: memoryLevels})
	waitAll := func(prefix string, n int) {
		var wg sync.WaitGroup
		window := make(chan struct{}, 64)
		for i := range n {
			key := fmt.Sprintf("%s-%d", prefix, i)
			window <- struct{}{}
			wg.Go(func() {
				defer func() { <-window }()
				held, err := sem.Acquire(t.Context(), key)
				if err != nil || !held.Acquired {
					t.Errorf("Acquire of %s: %+v, %v", key, held, err)
					return
				}
				waited := make(chan error, 1)
				go func() {
					slot, err := waitOrLevel(t.Context(), sem, key, i)
					if err == nil {
						err = sem.Release(t.Context(), slot)
					}
					waited <- err
				}()
				if err := sem.Release(t.Context(), held); err != nil {
					t.Error(err)
				}
				if err := <-waited; err != nil {
					t.Errorf("Wait for %s, and its release: %v", key, err)
				}
			})
		}
		wg.Wait()
	}
	// A warm-up, so that what is measured is per key and not the pool's
	// and semaphore's first allocations.
	waitAll("warm", 200)
	before := testdb.LiveHeap()
	start := time.Now()
	waitAll("k", keys)
	after, kept := testdb.LiveHeap(), pglimitsem.WaitingKeys(sem)
	perKey := (float64(after) - float64(before)) / float64(keys)
	t.Logf("%d keys waited for in %s; idle, %d wake channels kept, live heap %.1f B per key", keys, time.Since(start).Round(time.Millisecond), kept, perKey)
	if kept != 0 {
		t.Errorf("idle, the semaphore keeps the wake channels of %d keys; want none", kept)
	}
	if bound := float64(testdb.IdleBytesPerKey*keys + testdb.IdleNoise); float64(after)-float64(before) > bound {
		t.Errorf("idle, the semaphore keeps %.1f B per key, %.0f B in all; the bound is %d B per key and %d B", perKey, float64(after)-float64(before), testdb.IdleBytesPerKey, testdb.IdleNoise)
	}
	runtime.KeepAlive(sem)
}

// The same bound when every key's caller waits at once: callers of Wait
// and WaitLevel on many distinct keys, all blocked at once on a pool
// whose one connection the test holds (a database that does not answer
// in time), give up when their context ends, and leave nothing of any
// key, the wake channels' table included; their joins, never sent, start
// no removal. 100,000 keys in the full tier, 10,000 in the quick one.
func TestMemoryIdleWaitKeysAtOnce(t *testing.T) {
	keys := 100_000
	if testing.Short() {
		keys = 10_000
	}
	pcfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 1
	pcfg.ConnConfig.RuntimeParams["search_path"] = ""
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1, Timeout: time.Hour, Levels: memoryLevels})
	held, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	waitAll := func(prefix string, n int) {
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				if _, err := waitOrLevel(ctx, sem, fmt.Sprintf("%s-%d", prefix, i), i); !errors.Is(err, context.Canceled) {
					t.Errorf("Wait with no connection to be had: %v, want context.Canceled once the test gives up", err)
				}
			})
		}
		for deadline := time.Now().Add(time.Minute); pglimitsem.WaitingKeys(sem) < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d keys waiting after a minute", pglimitsem.WaitingKeys(sem), n)
			}
		}
		cancel()
		wg.Wait()
	}
	waitAll("warm", 200)
	// As many goroutines as the keys, first: the runtime keeps a
	// goroutine's descriptor once it has ended, for the next one.
	var gs sync.WaitGroup
	release := make(chan struct{})
	for range keys {
		gs.Go(func() { <-release })
	}
	close(release)
	gs.Wait()
	before := testdb.LiveHeap()
	waitAll("k", keys)
	after, kept := testdb.LiveHeap(), pglimitsem.WaitingKeys(sem)
	perKey := (float64(after) - float64(before)) / float64(keys)
	t.Logf("%d keys waited for at once; idle, %d wake channels kept, live heap %.1f B per key", keys, kept, perKey)
	if n := pglimitsem.Leaving(sem); n != 0 {
		t.Errorf("%d removals of joins under way, for joins that never got a connection; want none", n)
	}
	if kept != 0 {
		t.Errorf("idle, the semaphore keeps the wake channels of %d keys; want none", kept)
	}
	if bound := float64(testdb.IdleBytesPerKey*keys + testdb.IdleNoise); float64(after)-float64(before) > bound {
		t.Errorf("idle, the semaphore keeps %.1f B per key, %.0f B in all; the bound is %d B per key and %d B", perKey, float64(after)-float64(before), testdb.IdleBytesPerKey, testdb.IdleNoise)
	}
	runtime.KeepAlive(sem)
}
