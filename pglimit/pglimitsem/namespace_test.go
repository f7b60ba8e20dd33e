package pglimitsem_test

import (
	"context"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// Two semaphores without a Namespace on one table, of one slot and of
// two, keep their own slots: the two-slot one holding both of a key's
// leaves the one-slot one free to take its own. They once shared the
// namespace "default", and the one-slot semaphore found its slot held.
// Semaphores of as many slots derive one namespace, and share; the
// derived value is pinned, as instances of every release must agree (the
// SHA-256 of "19:pglimitsem.slots.v1;1:2;" begins 994b6b4f3e79).
func TestNamespaceDerived(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	open := func(slots int, seen *string) *pglimitsem.Semaphore {
		return newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: slots, TTL: time.Minute,
			Observe: func(_ context.Context, c pglimitsem.Call) { *seen = c.Namespace }})
	}
	var one, two, twoAgain string
	single, pair, pairAgain := open(1, &one), open(2, &two), open(2, &twoAgain)
	for i := range 2 {
		if s, err := pair.Acquire(ctx, "zed"); err != nil || !s.Acquired {
			t.Fatalf("two slots, acquisition %d: %+v, %v", i+1, s, err)
		}
	}
	if s, err := single.Acquire(ctx, "zed"); err != nil || !s.Acquired {
		t.Errorf("one slot, while the two-slot semaphore holds both of its own: acquired %t, %d held, %v; want its own slot", s.Acquired, s.Held, err)
	}
	if s, err := pairAgain.Acquire(ctx, "zed"); err != nil || s.Acquired || s.Held != 2 {
		t.Errorf("another two-slot semaphore: acquired %t, %d held, %v; want refused, the first one's 2 held", s.Acquired, s.Held, err)
	}
	if two != twoAgain {
		t.Errorf("two semaphores of 2 slots: namespaces %q and %q, want one", two, twoAgain)
	}
	for slots, c := range map[int]struct{ got, want string }{1: {one, "default-679f9216601f"}, 2: {two, "default-994b6b4f3e79"}} {
		if c.got != c.want {
			t.Errorf("%d slots: derived namespace %q, want %q", slots, c.got, c.want)
		}
	}
}
