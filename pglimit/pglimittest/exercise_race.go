package pglimittest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// exerciseRaces: concurrent requests for one key, on one instance or two,
// for a new key or one whose cooldown has just ended, admit exactly one.
func (s *suite) exerciseRaces(t *testing.T) {
	setup := s.setup
	ctx := context.Background()
	newLimiter := s.newLimiter
	o := s.opts

	t.Run("ConcurrentOneKeyAdmitsOne", func(t *testing.T) {
		lim, _ := setup(t, time.Minute)
		admitted, errs := race(ctx, []pglimit.Limiter{lim}, 10, "hot")
		if errs != nil || admitted != 1 {
			t.Fatalf("10 concurrent requests: %d admitted, errors %v; want exactly 1 admitted and no error", admitted, errs)
		}
	})

	t.Run("TwoInstancesAdmitOne", func(t *testing.T) {
		lim1, b := setup(t, time.Minute)
		lim2 := mustNew(t, newLimiter, o.pool(t), &pglimit.Config{Schema: b.schema, Cooldown: time.Minute})
		admitted, errs := race(ctx, []pglimit.Limiter{lim1, lim2}, 200, "hot")
		if errs != nil || admitted != 1 {
			t.Fatalf("200 requests over two pools: %d admitted, errors %v; want exactly 1 admitted and no error", admitted, errs)
		}
	})

	t.Run("ConcurrentAfterCooldownAdmitsOne", func(t *testing.T) {
		// Each key's row exists and its cooldown has ended: every racer
		// sees an admissible row, so only the row lock keeps them apart.
		// One race per key, so a narrow window still gets hit.
		const cooldown = time.Second
		lim1, b := setup(t, cooldown)
		lim2 := mustNew(t, newLimiter, o.pool(t), &pglimit.Config{Schema: b.schema, Cooldown: cooldown})
		keys := make([]string, 25)
		for i := range keys {
			keys[i] = fmt.Sprintf("hot-%d", i)
			mustAllow(t, lim1, keys[i])
		}
		time.Sleep(cooldown + 50*time.Millisecond)
		start := time.Now()
		admitted := make(map[string]int, len(keys))
		for _, key := range keys {
			n, errs := race(ctx, []pglimit.Limiter{lim1, lim2}, 8, key)
			if errs != nil {
				t.Fatalf("key %s: errors: %v", key, errs)
			}
			admitted[key] = n
		}
		// A race slower than the cooldown may rightly admit again.
		most := 1 + int(time.Since(start)/cooldown)
		for _, key := range keys {
			if n := admitted[key]; n < 1 || n > most {
				t.Errorf("key %s: %d of 8 concurrent requests admitted after the cooldown; want 1 (at most %d)", key, n, most)
			}
		}
	})
}
