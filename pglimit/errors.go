package pglimit

import "github.com/pglimit/cooldown/pglimit/internal/fault"

// Sentinel errors, every one the package has. Errors returned by this
// package wrap one of these (or a database error) so callers can test
// them with [errors.Is]. pglimitsem raises the same values.
var (
	// ErrInvalidKey reports a key or namespace that is empty, longer than
	// [MaxKeyLength], not valid UTF-8, or contains a NUL byte.
	ErrInvalidKey = fault.ErrInvalidKey

	// ErrInvalidID reports a decision id ([WithID]) that is empty, longer
	// than [MaxIDLength], not valid UTF-8, or contains a NUL byte. The
	// decision is not made and nothing is written.
	ErrInvalidID = fault.ErrInvalidID

	// ErrInvalidConfig reports a [Config] that cannot be used; the message
	// names the field. A decision returns it for what only the database
	// shows: a key's row of per-key limits that its limits cannot use
	// ([Config.Overrides]), or a calendar window's zone it does not know.
	ErrInvalidConfig = fault.ErrInvalidConfig

	// ErrTimeout reports a decision that did not finish within
	// [Config.Timeout]. The caller's own context deadline is reported as
	// [context.DeadlineExceeded] instead.
	ErrTimeout = fault.ErrTimeout

	// ErrNoExclusionConstraint reports a Range table without the exclusion
	// constraint that makes it a limiter (its btree_gist extension was
	// dropped, say). A Range limiter refuses to decide on such a table; run
	// [Migrate] on its schema to restore the constraint.
	ErrNoExclusionConstraint = fault.ErrNoExclusionConstraint

	// ErrUnsupported reports an operation the limiter's strategy, limits
	// or table cannot do: Reserve and Wait on Range or on a limit that is
	// not GCRA; Inspect, LimitedKeys, AllowAll, Refund and Settle on
	// Range; AllowAll, Refund, Settle and a limit's Debt on a table Citus
	// distributes; Refund and Settle of units served from a lease; a
	// decision id ([WithID]) on any call but Allow, AllowN, AllowTx,
	// AllowTxN, AllowAtMost, Reserve and AllowAll of Upsert or NoWait
	// limiters without Overrides or shadow mode (AllowAll's) on a table
	// Citus does not distribute (not yet).
	ErrUnsupported = fault.ErrUnsupported

	// ErrReadOnly reports a server that cannot write: a standby, a former
	// primary that came back as one after a failover, or a server in
	// read-only mode (default_transaction_read_only). Decisions, Reset and
	// [Migrate] need the primary; [Limiter.Peek] works on a standby. It
	// wraps the server's error (SQLSTATE 25006), or pgx's
	// [pgconn.ErrReadOnlyConnection] when a pool that asks for a read-write
	// server (target_session_attrs=read-write) reaches only read-only ones.
	ErrReadOnly = fault.ErrReadOnly

	// ErrUnavailable reports a database that could not be reached or was
	// lost during the call: no connection, a connection refused or cut, a
	// server shutting down, starting up or out of connections. It wraps
	// the driver's error. A call cut off after its statement was sent may
	// still have been decided (docs/operations.md, "Bounds every call
	// keeps").
	ErrUnavailable = fault.ErrUnavailable

	// ErrInvalidCost reports a cost (n) that is not positive, or larger
	// than any of the limiter's limits could ever admit at once. Nothing
	// is written.
	ErrInvalidCost = fault.ErrInvalidCost

	// ErrNotAdmitted reports a [Settle] or a Refund of a decision that took
	// no units from the database: a refusal, a shadow or fallback
	// admission, a zero Decision, or (for Settle) an admission in a
	// caller's transaction that rolled back; or a [RefundID] or [SettleID]
	// (or pglimitquota's) of an id with no admission stored.
	ErrNotAdmitted = fault.ErrNotAdmitted

	// ErrAlreadySettled reports a [Settle] of a decision settled before,
	// a Refund of one settled, or a [RefundID] or [SettleID] (or
	// pglimitquota's) of an id refunded or settled before.
	ErrAlreadySettled = fault.ErrAlreadySettled

	// ErrForeignDecision reports a [Settle] or a Refund of a decision that
	// another limiter made: another value of [New], even one of the same namespace,
	// limits and table, such as another instance's.
	ErrForeignDecision = fault.ErrForeignDecision

	// ErrExtension reports that the database lacks the btree_gist extension,
	// which the Range strategy's exclusion constraint needs, and that [Migrate]
	// could not create it. A Range limiter's decisions return it, wrapped with
	// [ErrNoExclusionConstraint]; the message says how to install it.
	ErrExtension = fault.ErrExtension
)
