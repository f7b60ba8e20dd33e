package pglimitsem_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// A critical level with a 25% guarantee (2 of 8 slots, none lent) keeps
// its p99 wait under one hold time while a batch level floods from two
// instances, one through PgBouncer.
func TestAcquireLevelGuarantee(t *testing.T) {
	t.Parallel()
	testdb.Slow(t)
	schema := testdb.Schema(t)
	cfg := pglimitsem.Config{Schema: schema, Slots: 8, TTL: time.Minute, Levels: []pglimitsem.Level{
		{Name: "critical", Min: 2, Lend: 0, Max: 8},
		{Name: "batch", Min: 0, Max: 8},
	}}
	sems := []*pglimitsem.Semaphore{newSemaphore(t, testdb.Pool(t), cfg), newSemaphore(t, testdb.PgBouncerPool(t), cfg)}
	const hold = 150 * time.Millisecond
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	// until takes a slot of level, asking every 2 ms, and says how long it
	// took.
	until := func(sem *pglimitsem.Semaphore, level string) (pglimitsem.Slot, time.Duration, bool) {
		start := time.Now()
		for ctx.Err() == nil {
			slot, err := sem.AcquireLevel(ctx, "k", level)
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("AcquireLevel(%s): %v", level, err)
				}
				break
			}
			if slot.Acquired {
				return slot, time.Since(start), true
			}
			time.Sleep(2 * time.Millisecond)
		}
		return pglimitsem.Slot{}, 0, false
	}
	for i := range 12 {
		wg.Go(func() {
			sem := sems[i%2]
			for {
				slot, _, ok := until(sem, "batch")
				if !ok {
					return
				}
				time.Sleep(hold)
				_ = sem.Release(context.Background(), slot)
			}
		})
	}
	var (
		mu    sync.Mutex
		waits []time.Duration
	)
	for i := range 2 {
		wg.Go(func() {
			sem := sems[i%2]
			for ctx.Err() == nil {
				time.Sleep(rand.N(hold))
				slot, waited, ok := until(sem, "critical")
				if !ok {
					return
				}
				mu.Lock()
				waits = append(waits, waited)
				mu.Unlock()
				time.Sleep(hold)
				_ = sem.Release(context.Background(), slot)
			}
		})
	}
	time.Sleep(4 * time.Second)
	stop()
	wg.Wait()
	slices.Sort(waits)
	if len(waits) < 20 {
		t.Fatalf("critical took %d slots, want at least 20", len(waits))
	}
	p99 := waits[len(waits)*99/100]
	t.Logf("critical: %d slots, wait p50 %s, p99 %s, max %s", len(waits), waits[len(waits)/2], p99, waits[len(waits)-1])
	if p99 >= hold {
		t.Errorf("critical's p99 wait %s, want under one hold time (%s)", p99, hold)
	}
}

// Borrowing fills idle capacity: with critical idle, batch holds its own
// guarantee, what critical lends and the slots no one is guaranteed, up
// to its ceiling; what critical does not lend stays free for it.
func TestAcquireLevelBorrowing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	for _, tc := range []struct {
		name          string
		lend, max     int
		batch, critic int // slots batch then critical get
	}{
		{"lends everything", 3, 8, 8, 0},
		{"lends one", 1, 8, 6, 2},
		{"lends nothing", 0, 8, 5, 3},
		{"batch's ceiling", 3, 4, 4, 4},
	} {
		sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Namespace: tc.name, Slots: 8, TTL: time.Minute, Levels: []pglimitsem.Level{
			{Name: "critical", Min: 3, Lend: tc.lend, Max: 8},
			{Name: "batch", Min: 2, Max: tc.max},
		}})
		take := func(level string) int {
			n := 0
			for range 10 {
				slot, err := sem.AcquireLevel(ctx, "k", level)
				if err != nil {
					t.Fatal(err)
				}
				if slot.Acquired {
					n++
				}
			}
			return n
		}
		if b, c := take("batch"), take("critical"); b != tc.batch || c != tc.critic {
			t.Errorf("%s: batch took %d, then critical %d; want %d and %d", tc.name, b, c, tc.batch, tc.critic)
		}
	}
}

// Bad levels are typed errors that write nothing: an unknown level, a
// floor above the ceiling, a guarantee lent past itself, guarantees above
// the slots.
func TestAcquireLevelBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	for name, levels := range map[string][]pglimitsem.Level{
		"floor above ceiling":     {{Name: "a", Min: 3, Max: 2}},
		"lends more than its Min": {{Name: "a", Min: 1, Lend: 2, Max: 2}},
		"negative Min":            {{Name: "a", Min: -1, Max: 2}},
		"Max above Slots":         {{Name: "a", Min: 1, Max: 5}},
		"Min above Slots":         {{Name: "a", Min: 3, Max: 4}, {Name: "b", Min: 2, Max: 4}},
		"named twice":             {{Name: "a", Max: 1}, {Name: "a", Max: 1}},
		"bad name":                {{Name: "", Max: 1}},
	} {
		if _, err := pglimitsem.New(pool, &pglimitsem.Config{Schema: schema, Slots: 4, Levels: levels}); !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 4, Levels: []pglimitsem.Level{{Name: "a", Min: 1, Max: 4}}})
	if slot, err := sem.AcquireLevel(ctx, "k", "b"); !errors.Is(err, pglimitsem.ErrUnknownLevel) || slot.Acquired {
		t.Errorf("unknown level: %+v, %v; want ErrUnknownLevel", slot, err)
	}
	if slot, err := sem.AcquireLevel(ctx, "", "a"); !errors.Is(err, pglimit.ErrInvalidKey) || slot.Acquired {
		t.Errorf("bad key: %+v, %v; want ErrInvalidKey", slot, err)
	}
	if n := heldSlots(t, pool, schema, "k"); n != 0 {
		t.Errorf("%d slots held after bad input, want 0", n)
	}
}
