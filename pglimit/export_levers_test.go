package pglimit

import "time"

// PreBlocks reports whether lim's pre-block refuses key now, without a
// round trip.
func PreBlocks(lim Limiter, key string) bool {
	var b *base
	switch l := lim.(type) {
	case *stmtLimiter:
		b = &l.base
	case *plainRangeLimiter:
		b = &l.base
	}
	return b.preblock.remaining(key, time.Now()) > 0
}
