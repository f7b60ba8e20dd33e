// Package leadership elects one leader among the processes that share a
// PostgreSQL database, with a session advisory lock held on a dedicated
// connection. [Elector] implements gocron v2's Elector interface.
//
// # Why a session advisory lock
//
// A session advisory lock belongs to one backend: the server releases it the
// moment that session ends, whatever ended it (a clean close, the process
// exiting, pg_terminate_backend, the server's idle_session_timeout). There is
// no lease to renew, and the work the leader does runs on that same
// connection ([Elector.Do]), so it executes only in the session that holds
// the lock: two processes never do the leader's work in the database at the
// same time. A lease row with an expiry would need renewing, and a leader
// that stalled past its expiry could still act after another took over
// unless every statement re-checked the lease.
//
// The lock cannot live on a pooled connection: the pool would hand the
// session (and the lock) to other callers, or close it and drop the lock
// unnoticed. The elector takes one connection out of the pool for good
// (pgxpool's Hijack, through [Config.Acquire]) and keeps it.
//
// The lock is re-entrant: pg_try_advisory_lock succeeds again in a session
// that already holds it, and each success needs its own unlock. The elector
// asks for it only while it is not the leader on the current session, so it
// holds it at most once, and it never unlocks: it closes the session.
//
// # States
//
// Every [Config.Interval] (E below) the elector takes one step; work done
// through [Elector.Do] can also find the connection dead.
//
//	              dial ok                 pg_try_advisory_lock = true
//	+--------+ --------------> +----------+ -------------------------> +--------+
//	|  lost  |                 | follower |                            | leader |
//	+--------+ <-------------- +----------+                            +--------+
//	  |  ^  ^   connection        |     ^                                  |
//	  |  |  |   closed            +-----+                                  |
//	  +--+  |                     lock = false:                            |
//	dial    |                     try again after E                        |
//	fails:  |                                                              |
//	again   +--------------------------------------------------------------+
//	after E    ping or Do finds the connection closed (terminated,
//	           idle_session_timeout, network gone): close it
//
// A lost elector dials and asks for the lock in the same step, so an
// elector whose own connection was killed may win again. From any state,
// Stop closes the connection, which releases the lock, and ends the loop.
//
// # Takeover bound
//
// When the leader's session ends for any reason the server sees (the
// process exits, its connection is closed or terminated with
// pg_terminate_backend, Stop), the lock is free at once and a follower takes
// it at its next step: within E plus one round trip (plus a dial, if the
// follower had lost its own connection too).
//
// A leader that dies during a statement (a cleanup batch) leaves the server
// running that statement, and holding the lock, until it ends; blocked on a
// row or table lock, that can be as long as its statement_timeout. The
// elector sets client_connection_check_interval = 1s on its session, so the
// server notices the closed connection within a second, aborts the
// statement and ends the session: takeover within 1s + E. (pgx itself
// sends a cancel request when a context cancels a query, so Stop's
// cancelled batch ends at once.)
//
// When the leader hangs or its host or network vanishes, the server notices
// only when the session has been idle for idle_session_timeout, which the
// elector sets on its session to max(4E, 5s); a live elector talks to the
// server every E, so it is never idle that long. Takeover then comes within
// max(4E, 5s) + E, plus the statement_timeout if it vanished during a batch. A
// leader that comes back finds its connection dead at its next ping or
// query and becomes a follower. Until then it still reports itself leader,
// but whatever it tries through Do fails: the database never sees two
// leaders' work at once.
//
// Both settings need PostgreSQL 14 or later.
//
// Elections need a real session: behind PgBouncer in transaction pooling
// mode, advisory locks do not work; give the elector a direct connection or
// a session-pooled one.
package leadership
