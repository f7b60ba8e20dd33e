// Package pglimit is a rate limiter enforced by PostgreSQL, so that it holds
// across every instance of an application with no Redis and no proxy: from
// the per-user cooldown ("at most once every N seconds") to N per window with
// a burst, costs per request and several limits on one key.
//
// # Usage
//
// Apply the schema with [Migrate], build a [Limiter] with [New], and ask it
// before the protected work:
//
//	lim, err := pglimit.New(pool, &pglimit.Config{Namespace: "export", Cooldown: 2 * time.Second})
//	d, err := lim.Allow(ctx, userID)
//	if !d.Allowed {
//		// tell the caller to come back after d.RetryAfter
//	}
//
// [Config.Limits] takes up to [MaxLimits] limits ([Limit]: Rate per Period,
// by [GCRA] with a Burst, [FixedWindow] or [SlidingWindow]) that a key must
// satisfy all at once; [Limiter.AllowN] charges a cost, [Limiter.AllowAtMost]
// grants what is left, [Limiter.Reserve] books a future slot, [Limiter.Peek]
// consumes nothing. docs/limits.md in the repository defines each algorithm
// to the microsecond.
//
// # Promises
//
// No over-admission: whatever the number of goroutines, pools or application
// instances, no limit ever admits more than it allows, judged by the database
// clock at the instant each decision writes (after any wait for a lock), and
// several limits on one key are all-or-nothing. A lone request is admitted as
// soon as its limits allow. Every decision says when to come back. A decision
// never waits longer than the caller's context or Config.Timeout. Keys are
// independent of each other. Bad input ([ErrInvalidKey], [ErrInvalidConfig],
// [ErrInvalidCost]) is refused before anything reaches the database.
//
// # Strategies
//
// [Upsert] (the default) locks the key's row only if the request fits, then
// updates it, or inserts it for a key never seen; [NoWait] does the same but
// waits at most 20 ms for the row's lock, and refuses when someone else holds
// it longer; [Range] inserts a tstzrange into a table with an exclusion
// constraint and keeps one row per admission (a cooldown only). Each is one statement, one round trip,
// and a refusal takes no lock and writes nothing. All three pass the same
// conformance suite (package pglimittest).
//
// Concurrent Allow and AllowN calls of a limiter of one GCRA limit (a
// cooldown among them) share statements and commits in each process (group
// commit), and calls on one key merge into one request: see
// docs/throughput.md. Each is still decided as its own statement would
// decide it, all or nothing.
//
// Config.AsyncCommit takes the WAL flush out of admissions, at the price of at
// most one early admission per key after a database crash. Config.PreBlockSize
// refuses keys the database has said have no unit left without a round trip
// until they have one; with an Invalidator, a Reset from any instance reaches
// every pre-block within milliseconds. The unlogged tables
// (see Config.Table) take the WAL out of admissions, at the price of every
// key's state after a crash.
//
// The pre-block stays off by default: it needs an Invalidator to follow other
// instances' Resets, and an Invalidator needs a session of its own (LISTEN,
// which PgBouncer's transaction pooling cannot carry) and a goroutine to stop,
// which New, given only a DB, cannot provide.
//
// # Cleanup
//
// The Range table gains a row per admission, the others a row per key ever
// seen. Run a cleaner (package pglimitclean) in every instance: they elect
// one leader through a PostgreSQL advisory lock, and it deletes, in
// batches, rows whose limits have all replenished more than its Retention
// ago. A program that only decides does not link it, nor its scheduler.
//
// # Recorded policies
//
// A limiter records its policy (strategy, limits, per-key limits) in the
// pglimit_policies table of its schema once, at its first decision, off
// the decision's path; [RecordedPolicies] reads it, and the pglimit command
// checks a description of a limiter against it, or uses it. During a
// rolling deploy that changes a namespace's limits, the table keeps the
// latest policy recorded and the one before it, and both versions decide as
// they always did. A schema migrated before the table existed, or a role
// that may not write it, records nothing and decides as before.
//
// # Citus
//
// On a Citus cluster, run [Distribute] on the coordinator after [Migrate]:
// it distributes the tables by key and installs functions that Citus
// delegates to the node holding each key, so that a decision is one hop.
// Limiters notice a distributed table on their first decision and need no
// other change; docs/citus.md in the repository has the details and figures.
//
// # Transactions
//
// [Limiter.AllowTx] and [Limiter.AllowTxN] decide inside the caller's
// transaction, so units are consumed only if the caller's work commits. Their
// statement runs in a savepoint, so it never aborts the caller's transaction:
// a lost race, at any isolation level, is a refusal, and a wait past
// Config.Timeout (bounded on the server by lock_timeout) is [ErrTimeout]; the
// transaction stays usable either way. While that transaction is open, other
// requests for the key wait for it, up to Config.Timeout (NoWait refuses them
// instead, except for a key the transaction admits for the first time, whose
// new row they wait on), so keep such transactions short: the admission is
// dated when AllowTx writes, not when the transaction commits.
//
// Two things do end the caller's transaction. Cancelling ctx while the
// statement runs does, because the driver then closes the connection; so does
// a server that does not answer at all, which AllowTx gives up on one second
// past Config.Timeout ([ErrTimeout]), leaving the server that second to report
// its own.
//
// [Limiter.Allow] decides the same whatever the session's default isolation
// level: a serialization failure of its own statement makes it run again on a
// fresh snapshot.
package pglimit
