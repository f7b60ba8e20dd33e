package main

import (
	"log/slog"
	"sync"
	"time"
)

// failureLog logs limiter failures at a bounded rate: the first failure at
// once, then at most one line per interval saying how many were left out.
// During a database outage every protected request fails; a line for each
// would bury the logs just when they matter. The metrics count every one.
type failureLog struct {
	log      *slog.Logger
	interval time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (f *failureLog) record(now time.Time, args ...any) {
	f.mu.Lock()
	if now.Sub(f.last) < f.interval {
		f.suppressed++
		f.mu.Unlock()
		return
	}
	suppressed := f.suppressed
	f.last, f.suppressed = now, 0
	f.mu.Unlock()
	f.log.Warn("limiter failed", append(args, "suppressed_since_last", suppressed)...)
}
