package pglimithttp

import (
	"cmp"
	"log/slog"
	"sync"
	"time"
)

// failureLog logs limiter failures at a bounded rate: the first at once,
// then at most one line per interval, counting those left out in between.
// Those left out after the last line are counted in the next one; the
// metrics ([Config.OnDecision]) see every failure.
type failureLog struct {
	log      *slog.Logger // nil: slog.Default()
	interval time.Duration

	mu         sync.Mutex
	last       time.Time // zero until the first line
	suppressed int
}

func (f *failureLog) record(now time.Time, args ...any) {
	f.mu.Lock()
	if !f.last.IsZero() && now.Sub(f.last) < f.interval {
		f.suppressed++
		f.mu.Unlock()
		return
	}
	suppressed := f.suppressed
	f.last, f.suppressed = now, 0
	f.mu.Unlock()
	cmp.Or(f.log, slog.Default()).Warn("pglimithttp: limiter failed", append(args, "suppressed", suppressed)...)
}
