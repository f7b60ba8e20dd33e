package preblock

import (
	"fmt"
	"testing"
	"time"
)

func TestPreblockStaysWithinItsSize(t *testing.T) {
	t.Parallel()
	const size = 100
	p := New(size, nil)
	until := time.Now().Add(time.Hour)
	for i := range 10 * size {
		p.Block(fmt.Sprintf("flood-%d", i), until, 0)
		if n := p.Len(); n > size {
			t.Fatalf("after %d keys the pre-block holds %d entries, more than its size %d", i+1, n, size)
		}
	}
	// The newest key is always kept.
	if p.Remaining(fmt.Sprintf("flood-%d", 10*size-1), time.Now()) <= 0 {
		t.Fatal("the key just blocked was evicted")
	}
}

func TestPreblockRemaining(t *testing.T) {
	t.Parallel()
	p := New(10, nil)
	now := time.Now()
	p.Block("k", now.Add(time.Minute), 0)
	if got := p.Remaining("k", now); got != time.Minute {
		t.Fatalf("remaining = %s, want 1m", got)
	}
	if got := p.Remaining("k", now.Add(2*time.Minute)); got != 0 {
		t.Fatalf("remaining after the end = %s, want 0", got)
	}
	if got := p.Remaining("other", now); got != 0 {
		t.Fatalf("remaining for an unknown key = %s, want 0", got)
	}
	p.Block("past", now.Add(-time.Second), 0)
	if p.Len() != 1 {
		t.Fatal("an already ended block was stored")
	}
	p.Forget("k")
	if got := p.Remaining("k", now); got != 0 {
		t.Fatalf("remaining after forget = %s, want 0", got)
	}
	var off *Cache
	off.Block("k", now.Add(time.Minute), 0)
	if off.Remaining("k", now) != 0 {
		t.Fatal("a nil pre-block blocked")
	}
}

// A decision that began before a Reset does not record its block: its
// statement may have read the key before the Reset deleted it.
func TestPreblockIgnoresBlocksFromBeforeAReset(t *testing.T) {
	t.Parallel()
	p := New(10, nil)
	gen := p.Generation()
	p.Forget("k") // a Reset while the decision ran
	p.Block("k", time.Now().Add(time.Minute), gen)
	if got := p.Remaining("k", time.Now()); got != 0 {
		t.Fatalf("remaining = %s after a block from before a Reset, want 0", got)
	}
	p.Block("k", time.Now().Add(time.Minute), p.Generation())
	if got := p.Remaining("k", time.Now()); got <= 0 {
		t.Fatal("a block from after the Reset was not recorded")
	}
}
