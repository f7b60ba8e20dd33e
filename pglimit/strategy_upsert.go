package pglimit

// Upsert decides with a guarded UPDATE, and an INSERT ... ON CONFLICT DO
// NOTHING for a key never seen, in one statement.
//
// The guard keeps concurrent requests apart: an UPDATE that finds the row
// locked waits for the holder and re-checks the guard against the row it
// left, so two requests can never both see an ended cooldown. A refusal
// matches no row, so it takes no lock and writes nothing: on a hot key it
// costs a round trip, not a WAL flush (INSERT ... ON CONFLICT DO UPDATE, the
// textbook form, locks and WAL-logs the row even when its WHERE refuses).
//
// The last branch reads the current cooldown so that a refusal says when to
// come back in the same round trip. It sees the statement's snapshot: a row
// admitted concurrently may be invisible to it, which refused() turns into
// the whole cooldown.
const upsertAllowSQL = `
WITH updated AS (
    UPDATE %[1]s AS t
    SET expires_at = statement_timestamp() + $3::bigint * interval '1 microsecond'
    WHERE t.namespace = $1 AND t.key = $2 AND t.expires_at <= statement_timestamp()
    RETURNING t.expires_at
), inserted AS (
    INSERT INTO %[1]s (namespace, key, expires_at)
    SELECT $1, $2, statement_timestamp() + $3::bigint * interval '1 microsecond'
    WHERE NOT EXISTS (SELECT FROM updated)
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING expires_at
)
` + keyRowAnswerSQL

// keyRowAnswerSQL ends the Upsert and NoWait statements, whose admitting
// parts are the CTEs updated and inserted: the row one of them wrote, else
// the key's current cooldown as a refusal.
const keyRowAnswerSQL = `
SELECT true, (extract(epoch FROM expires_at - statement_timestamp()) * 1000000)::bigint, %[2]s FROM updated
UNION ALL
SELECT true, (extract(epoch FROM expires_at - statement_timestamp()) * 1000000)::bigint, %[2]s FROM inserted
UNION ALL
SELECT false, (extract(epoch FROM t.expires_at - statement_timestamp()) * 1000000)::bigint, NULL::text
FROM %[1]s AS t
WHERE t.namespace = $1 AND t.key = $2
  AND NOT EXISTS (SELECT FROM updated) AND NOT EXISTS (SELECT FROM inserted)`

const deleteKeySQL = `DELETE FROM %s WHERE namespace = $1 AND key = $2`

func newUpsert(b base, table string) *stmtLimiter {
	return newStmtLimiter(b, table, upsertAllowSQL, "")
}
