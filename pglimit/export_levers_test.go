package pglimit

import "time"

// PreBlocks reports whether lim's pre-block refuses key now, without a
// round trip.
func PreBlocks(lim Limiter, key string) bool {
	return lim.(*stmtLimiter).preblock.remaining(key, time.Now()) > 0
}

// BatchFailures is how many of lim's batch statements failed; -1 when lim
// does not batch.
func BatchFailures(lim Limiter) int64 {
	l, ok := lim.(*stmtLimiter)
	if !ok || l.batch == nil {
		return -1
	}
	l.batch.mu.Lock()
	defer l.batch.mu.Unlock()
	return l.batch.failures
}

// BatchPending is how many calls wait in lim's open batch.
func BatchPending(lim Limiter) int {
	b := lim.(*stmtLimiter).batch
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open == nil {
		return 0
	}
	return len(b.open.calls)
}

// SetBatchWindow sets lim's batch window past what Config accepts, so that
// a test decides when a batch is sent.
func SetBatchWindow(lim Limiter, window time.Duration) {
	lim.(*stmtLimiter).batch.window = window
}

// BatchesInFlight is how many statements a batching limiter runs at once
// before calls gather in a batch.
const BatchesInFlight = batchesInFlight
