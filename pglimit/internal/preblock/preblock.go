// Package preblock remembers, per key, a local time before which the
// database is known to refuse the key, so that a limiter refuses it again
// without a round trip (pglimit.Config.PreBlockSize).
package preblock

import (
	"sync"
	"time"
)

// Cache remembers, per key, a local time before which the database is
// known to refuse it. All methods are safe on a nil *Cache, which is the
// pre-block turned off.
type Cache struct {
	mu    sync.Mutex
	max   int
	until map[string]time.Time

	// resets counts forget calls. A decision records a block only if no
	// Reset happened while it ran: its statement may have read the key
	// before the Reset deleted it.
	resets uint64

	// trusted, when not nil, says whether entries may be trusted at a
	// time: an Invalidator carries other instances' Resets here, and
	// without it listening, no entry is trusted.
	trusted func(now time.Time) bool
}

// New returns a cache of at most size keys; trusted, if not nil, says when
// its entries may be trusted.
func New(size int, trusted func(now time.Time) bool) *Cache {
	return &Cache{max: size, until: make(map[string]time.Time, min(size, 1024)), trusted: trusted}
}

// Remaining returns how long key is still blocked at now, or 0.
func (p *Cache) Remaining(key string, now time.Time) time.Duration {
	if p == nil || (p.trusted != nil && !p.trusted(now)) {
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

// Generation returns the number of resets so far, for Block.
func (p *Cache) Generation() uint64 {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resets
}

// Block records that key is refused until the local time until, unless a
// reset happened since Generation returned gen.
func (p *Cache) Block(key string, until time.Time, gen uint64) {
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
func (p *Cache) evict() {
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

// Forget forgets key: a Reset of it.
func (p *Cache) Forget(key string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	delete(p.until, key)
	p.resets++
	p.mu.Unlock()
}

// Clear forgets every key, as if each had been reset.
func (p *Cache) Clear() {
	p.mu.Lock()
	clear(p.until)
	p.resets++
	p.mu.Unlock()
}

// Len returns how many keys the cache holds.
func (p *Cache) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.until)
}
