package pglimit

import "time"

// PreBlocks reports whether lim's pre-block refuses key now, without a
// round trip.
func PreBlocks(lim Limiter, key string) bool {
	return lim.(*stmtLimiter).preblock.remaining(key, time.Now()) > 0
}
