// Package engine holds the capability table: which operation works on
// which limiter, and the one place that raises ErrUnsupported for one
// that does not. It takes plain values ([Shape]), not pglimit's types:
// nothing under pglimit/internal imports the root.
//
// The table, in prose (Check answers each row; its test pins every cell):
//
//   - Allow, AllowN, AllowTx, AllowTxN and AllowAtMost work on every
//     strategy and limit set. With a decision id they need Upsert or
//     NoWait without Overrides, on a table Citus does not distribute.
//   - Reserve (and Wait, which reserves) needs Upsert or NoWait, and GCRA
//     limits only; with an id, as above.
//   - Peek works everywhere, and ignores an id.
//   - AllowAll needs Upsert or NoWait on a table Citus does not
//     distribute; with an id, each level also needs no Overrides and no
//     shadow mode.
//   - Refund and Settle need Upsert or NoWait on a table Citus does not
//     distribute, and a decision whose units did not come from a lease;
//     RefundID and SettleID need Upsert or NoWait without Overrides, on a
//     table Citus does not distribute.
//   - Inspect and LimitedKeys need Upsert or NoWait: a Range row is an
//     admission, not a key's state.
//   - Pause needs one GCRA limit without Overrides on Upsert or NoWait,
//     on a table Citus does not distribute.
//   - Reset and the per-key limits' operations (SetKeyLimits,
//     SetKeyLimitsFor, ListKeyLimits) have no row of their own.
//   - Every operation ([Open], the check of the table that each one
//     runs before its first statement on it): a table Citus distributes
//     needs pglimit's functions there (Distribute), and a limiter on it
//     takes no Debt, no calendar window and no Overrides.
//   - Distribute needs the citus extension in the database.
//
// The table kind (durable or unlogged) is no facet: the unlogged tables
// take every operation the durable ones take.
//
// An operation's own rows come before the rows every operation shares;
// a call that runs [Open] first meets the shared rows first. A facet
// the caller has not found out yet (the deployment, before the first
// statement) is [Unchecked], and answers nothing.
package engine
