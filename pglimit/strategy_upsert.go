package pglimit

import "github.com/pglimit/cooldown/pglimit/internal/queries"

// Upsert locks the key's row if it admits the request, then updates it, or
// inserts it for a key never seen, in one statement (upsert.allow, in
// internal/queries, says how). This is the statement of a single GCRA
// limit, of which a cooldown is one; other limits use the general
// statement.
func newUpsert(l *limiter, table string) *limiter {
	return newStmtLimiter(l, table, "upsert.allow", queries.Static("upsert.lock"), "")
}
