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
// for a key in cooldown takes no lock and writes nothing.
const noWaitAllowSQL = `
WITH locked AS (
    SELECT t.namespace FROM %[1]s AS t
    WHERE t.namespace = $1 AND t.key = $2 AND t.expires_at <= statement_timestamp()
    FOR UPDATE NOWAIT
), updated AS (
    UPDATE %[1]s AS t
    SET expires_at = statement_timestamp() + $3::bigint * interval '1 microsecond'
    FROM locked
    WHERE t.namespace = $1 AND t.key = $2
    RETURNING t.expires_at
), inserted AS (
    INSERT INTO %[1]s (namespace, key, expires_at)
    SELECT $1, $2, statement_timestamp() + $3::bigint * interval '1 microsecond'
    WHERE NOT EXISTS (SELECT FROM locked)
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING expires_at
)
` + keyRowAnswerSQL

func newNoWait(b base, table string) *stmtLimiter {
	return newStmtLimiter(b, table, noWaitAllowSQL, codeLockNotAvailable)
}
