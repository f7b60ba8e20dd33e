package pglimit

// Upsert locks the key's row if its cooldown has ended, then updates it, or
// inserts it for a key never seen, in one statement.
//
// The guard keeps concurrent requests apart: a FOR UPDATE that finds the
// row locked waits for the holder and re-checks the guard against the row it
// left, so two requests can never both see an ended cooldown. A refusal
// matches no row, so it takes no lock and writes nothing: on a hot key it
// costs a round trip, not a WAL flush (INSERT ... ON CONFLICT DO UPDATE, the
// textbook form, locks and WAL-logs the row even when its WHERE refuses).
//
// Both the guard and the new cooldown read clock_timestamp() when the row
// is written, after any wait for the lock: the UPDATE's values are computed
// only once locked has its row (a plain guarded UPDATE computes them before
// it waits, and keeps them if the holder rolls back), and
// statement_timestamp() would date the cooldown from before the wait.
const upsertAllowSQL = `
WITH locked AS (
    SELECT t.namespace FROM %[1]s AS t
    WHERE t.namespace = $1 AND t.key = $2 AND t.expires_at <= clock_timestamp()
    FOR UPDATE
),` + keyRowTailSQL

// keyRowTailSQL ends the Upsert and NoWait statements, which begin with
// locked, the key's row once locked if its cooldown has ended: its update,
// the key's row as this statement's snapshot sees it, the insertion of a
// key it does not see, and the answer.
//
// A first request takes a transaction-level advisory lock on the key
// (table, namespace and key: $4 hashes the first two) before it stamps its
// row: a concurrent first request (in a caller's open transaction, say)
// then makes it wait before, not after, it reads the clock, so a row
// inserted after a wait never carries a cooldown that began before it. The
// lock is taken only for a key with no row, never on the refusal path.
//
// The answer: the row one of them wrote, else a refusal while the
// snapshot's row is in cooldown, else no row at all: the key changed after
// the snapshot (a concurrent admission, Reset or cleanup), and the caller
// runs the statement again on a fresh one.
const keyRowTailSQL = `
updated AS (
    UPDATE %[1]s AS t
    SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond'
    FROM locked
    WHERE t.namespace = $1 AND t.key = $2
    RETURNING t.expires_at
), current AS (
    SELECT t.expires_at FROM %[1]s AS t
    WHERE t.namespace = $1 AND t.key = $2
), first AS (
    SELECT pg_advisory_xact_lock($4::integer, hashtext($2))
    WHERE NOT EXISTS (SELECT FROM current)
), inserted AS (
    INSERT INTO %[1]s (namespace, key, expires_at)
    SELECT $1, $2, clock_timestamp() + $3::bigint * interval '1 microsecond' FROM first
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING expires_at
)
SELECT true, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint, %[2]s FROM updated
UNION ALL
SELECT true, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint, %[2]s FROM inserted
UNION ALL
SELECT false, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint, NULL::text FROM current
WHERE expires_at > clock_timestamp() AND NOT EXISTS (SELECT FROM updated)`

const deleteKeySQL = `DELETE FROM %s WHERE namespace = $1 AND key = $2`

func newUpsert(b base, table string) *stmtLimiter {
	return newStmtLimiter(b, table, upsertAllowSQL, "")
}
