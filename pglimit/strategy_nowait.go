package pglimit

import (
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// NoWait locks the key's row, then updates it, or inserts it for a key
// never seen. It waits for the row's lock at most noWaitPatience: long
// enough for a concurrent admission of the key to commit (its WAL flush
// included, under load), too short to queue behind a caller's transaction
// that holds the row (AllowTx). A lock not granted by then raises
// lock_not_available (55P03), and the request is refused.
//
// This strategy's first form ran SELECT, UPDATE or INSERT and COMMIT as
// separate round trips, and locked with FOR UPDATE NOWAIT, which
// refused most requests that fitted a busy key's limit: another admission
// of it held the row for a few hundred microseconds (docs/throughput.md).
// Here it is one statement (nowait.allow). The lock is taken only on a row
// that fits the request in the statement's snapshot (FOR UPDATE re-checks
// that against the latest row version), so a refusal takes no lock and
// writes nothing. The bounded wait is lock_timeout, set for the
// statement's transaction by a condition the row must pass before it is
// locked (nowait.lock); in a caller's transaction (AllowTx) the caller's
// own lock_timeout is restored after the statement. It differs from Upsert
// only in that wait, here and in the general statement.

// noWaitPatience is how long NoWait waits for a row lock that another
// decision holds; the statement nowait.condition says the same to the
// server.
const noWaitPatience = 20 * time.Millisecond

func newNoWait(l *limiter, table string) *limiter {
	return newStmtLimiter(l, table, "nowait.allow", queries.Static("nowait.lock"), pgtx.CodeLockNotAvailable)
}
