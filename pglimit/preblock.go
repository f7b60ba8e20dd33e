package pglimit

import (
	"sync"
	"time"
)

// preblock remembers, per key, a local time before which the database is
// known to refuse it. All methods are safe on a nil *preblock, which is the
// pre-block turned off.
type preblock struct {
	mu    sync.Mutex
	max   int
	until map[string]time.Time

	// resets counts forget calls. A decision records a block only if no
	// Reset happened while it ran: its statement may have read the key
	// before the Reset deleted it.
	resets uint64

	// inv, when not nil, carries other instances' Resets here; without
	// it listening, no entry is trusted.
	inv *Invalidator
}

func newPreblock(size int) *preblock {
	return &preblock{max: size, until: make(map[string]time.Time, min(size, 1024))}
}

// remaining returns how long key is still blocked at now, or 0.
func (p *preblock) remaining(key string, now time.Time) time.Duration {
	if p == nil || (p.inv != nil && !p.inv.trusted(now)) {
		return 0
	}
	p.mu.Lock()
	until, ok := p.until[key]
	p.mu.Unlock()
	if !ok {
		return 0
	}
	return max(until.Sub(now), 0)
}

// generation returns the number of resets so far, for block.
func (p *preblock) generation() uint64 {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resets
}

// block records that key is refused until the local time until, unless a
// reset happened since generation returned gen.
func (p *preblock) block(key string, until time.Time, gen uint64) {
	if p == nil || !until.After(time.Now()) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resets != gen {
		return
	}
	if _, ok := p.until[key]; !ok && len(p.until) >= p.max {
		p.evict()
	}
	p.until[key] = until
}

// evict makes room: every ended entry and, if that frees less than a
// tenth of the cache, arbitrary live ones up to a tenth, so that a flood of
// new keys pays for a sweep only once every max/10 insertions. Losing a live
// entry costs one round trip, never a wrong decision.
func (p *preblock) evict() {
	now := time.Now()
	for k, until := range p.until {
		if !until.After(now) {
			delete(p.until, k)
		}
	}
	target := p.max - max(p.max/10, 1)
	for k := range p.until {
		if len(p.until) <= target {
			return
		}
		delete(p.until, k)
	}
}

func (p *preblock) forget(key string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	delete(p.until, key)
	p.resets++
	p.mu.Unlock()
}

// clear forgets every key, as if each had been reset.
func (p *preblock) clear() {
	p.mu.Lock()
	clear(p.until)
	p.resets++
	p.mu.Unlock()
}

func (p *preblock) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.until)
}
