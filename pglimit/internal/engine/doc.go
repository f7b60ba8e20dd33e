// Package engine holds the stages of a limiter's work that need none of
// pglimit's types, in plain values ([Shape], [Spec]): nothing under
// pglimit/internal imports the root, which translates its Config.
//
//   - caps.go, the capability table: which operation works on which
//     limiter, and the one place that raises ErrUnsupported for one that
//     does not ([Check]).
//   - statements.go, the statements: every statement a limiter sends,
//     written once, when pglimit.New makes it ([Build]), from the
//     templates of internal/queries and the arithmetic of internal/arith.
//
// # The statements
//
// [Build] writes, from a [Spec], the statements that decide a key (the
// fast statement of a single GCRA limit, the general statement by mode,
// Peek's), those that act on a key beside deciding it (Reset, Refund,
// Settle, Pause, AllowAll's blank row, Inspect, LimitedKeys, and the
// per-key limits' operations), those of decisions with an id, and the
// group commit's. [Citus] writes the calls that replace the statements
// that decide a key on a table Citus distributes, once the limiter has
// found it so. [Hierarchy] writes AllowAll's statement for a set of
// levels, at the first call for the set, which the root keeps. Beside
// it, and the statements on the schema rather than on a limiter's keys
// (Migrate's, Distribute's, the policies table's), which the root
// writes, no statement is written at a call. pglimit's
// TestStatementsGolden and TestStatementsAllGolden pin every text byte
// for byte.
//
// # The capability table
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
