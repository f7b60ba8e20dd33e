package pglimit

// NoWait locks the key's row with FOR UPDATE NOWAIT, then updates it, or
// inserts it for a key never seen. A row locked by someone else raises
// lock_not_available (55P03): a concurrent request is deciding right now, so
// this one is refused without waiting.
//
// The article this strategy comes from ran SELECT, UPDATE or INSERT and
// COMMIT as separate round trips; here they are one statement. The lock is
// taken only on a row that fits the request in the statement's snapshot
// (FOR UPDATE re-checks that against the latest row version), so a refusal
// takes no lock and writes nothing. It differs from Upsert only in NOWAIT,
// here and in the general statement.
const noWaitAllowSQL = `
WITH locked AS (
    SELECT t.expires_at FROM %[1]s AS t
    WHERE t.namespace = $1 AND t.key = $2 AND t.expires_at <= clock_timestamp() + $5::bigint * interval '1 microsecond'
    FOR UPDATE NOWAIT
),` + keyRowTailSQL

func newNoWait(b base, table string) *stmtLimiter {
	return newStmtLimiter(b, table, noWaitAllowSQL, "FOR UPDATE NOWAIT", codeLockNotAvailable)
}
