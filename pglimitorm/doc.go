// Package pglimitorm holds tested examples of pglimit under database/sql's
// ORMs and drivers: GORM, sqlx, and lib/pq. It exports nothing; the adapter
// they use is [github.com/pglimit/cooldown/pglimit/pglimitsql].
//
// Each example decides inside the ORM's transaction with
// [pglimit.Limiter.AllowTx], so that a decision counts only if the
// transaction commits, and rolls one transaction back to show it.
//
// The examples are a module of their own, so that importers of pglimit
// never download an ORM.
package pglimitorm
