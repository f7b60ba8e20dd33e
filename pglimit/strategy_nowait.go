package pglimit

// NoWait locks the key's row with FOR UPDATE NOWAIT, then updates it, or
// inserts it for a key never seen. A row locked by someone else raises
// lock_not_available (55P03): a concurrent request is deciding right now, so
// this one is refused without waiting.
//
// The article this strategy comes from ran SELECT, UPDATE or INSERT and
// COMMIT as separate round trips; here they are one statement. The lock is
// taken only on a row whose cooldown has ended in the statement's snapshot
// (FOR UPDATE re-checks that against the latest row version), so a refusal
// for a key in cooldown takes no lock and writes nothing. It differs from
// Upsert only in NOWAIT.
const noWaitAllowSQL = `
WITH locked AS (
    SELECT t.namespace FROM %[1]s AS t
    WHERE t.namespace = $1 AND t.key = $2 AND t.expires_at <= clock_timestamp()
    FOR UPDATE NOWAIT
),` + keyRowTailSQL

func newNoWait(b base, table string) *stmtLimiter {
	return newStmtLimiter(b, table, noWaitAllowSQL, codeLockNotAvailable)
}
