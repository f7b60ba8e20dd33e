package pglimit

import (
	"fmt"
	"testing"
	"time"
)

func TestPreblockStaysWithinItsSize(t *testing.T) {
	t.Parallel()
	const size = 100
	p := newPreblock(size)
	until := time.Now().Add(time.Hour)
	for i := range 10 * size {
		p.block(fmt.Sprintf("flood-%d", i), until, 0)
		if n := p.len(); n > size {
			t.Fatalf("after %d keys the pre-block holds %d entries, more than its size %d", i+1, n, size)
		}
	}
	// The newest key is always kept.
	if p.remaining(fmt.Sprintf("flood-%d", 10*size-1), time.Now()) <= 0 {
		t.Fatal("the key just blocked was evicted")
	}
}

func TestPreblockRemaining(t *testing.T) {
	t.Parallel()
	p := newPreblock(10)
	now := time.Now()
	p.block("k", now.Add(time.Minute), 0)
	if got := p.remaining("k", now); got != time.Minute {
		t.Fatalf("remaining = %s, want 1m", got)
	}
	if got := p.remaining("k", now.Add(2*time.Minute)); got != 0 {
		t.Fatalf("remaining after the end = %s, want 0", got)
	}
	if got := p.remaining("other", now); got != 0 {
		t.Fatalf("remaining for an unknown key = %s, want 0", got)
	}
	p.block("past", now.Add(-time.Second), 0)
	if p.len() != 1 {
		t.Fatal("an already ended block was stored")
	}
	p.forget("k")
	if got := p.remaining("k", now); got != 0 {
		t.Fatalf("remaining after forget = %s, want 0", got)
	}
	var off *preblock
	off.block("k", now.Add(time.Minute), 0)
	if off.remaining("k", now) != 0 {
		t.Fatal("a nil pre-block blocked")
	}
}

// A decision that began before a Reset does not record its block: its
// statement may have read the key before the Reset deleted it.
func TestPreblockIgnoresBlocksFromBeforeAReset(t *testing.T) {
	t.Parallel()
	p := newPreblock(10)
	gen := p.generation()
	p.forget("k") // a Reset while the decision ran
	p.block("k", time.Now().Add(time.Minute), gen)
	if got := p.remaining("k", time.Now()); got != 0 {
		t.Fatalf("remaining = %s after a block from before a Reset, want 0", got)
	}
	p.block("k", time.Now().Add(time.Minute), p.generation())
	if got := p.remaining("k", time.Now()); got <= 0 {
		t.Fatal("a block from after the Reset was not recorded")
	}
}
