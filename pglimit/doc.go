// Package pglimit is a per-key cooldown ("this user may call this at most
// once every N seconds") enforced by PostgreSQL, so that it holds across
// every instance of an application with no Redis and no proxy.
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
// # Promises
//
// For a limiter with cooldown C, two admissions of one key are never less
// than C apart, judged by the database clock, whatever the number of
// goroutines, pools or application instances. After C has passed, the next
// request is admitted. Every decision says when to come back. A decision
// never waits longer than the caller's context or [Config.Timeout]. Keys are
// independent of each other. Bad input ([ErrInvalidKey], [ErrInvalidConfig])
// is refused before anything reaches the database.
//
// # Strategies
//
// [Upsert] (the default) decides with a guarded UPDATE, or an INSERT for a
// key never seen; [NoWait] locks the key's row with FOR UPDATE NOWAIT and
// refuses when someone else holds it; [Range] inserts a tstzrange into a
// table with an exclusion constraint and keeps one row per admission. Each
// is one statement, one round trip, and a refusal for a key in cooldown
// takes no lock and writes nothing. All three pass the same conformance
// suite (package pglimittest).
//
// [Config.AsyncCommit] takes the WAL flush out of admissions, at the price
// of at most one early admission per key after a database crash.
// [Config.PreBlockSize] refuses keys the database has put in cooldown
// without a round trip until their cooldown ends.
//
// # Cleanup
//
// The Range table gains a row per admission, the others a row per key ever
// seen. Run a [Cleaner] in every instance: they elect one leader through a
// PostgreSQL advisory lock, and it deletes, in batches, rows whose cooldown
// ended more than [CleanerConfig.Retention] ago. [Cleaner.Stats] exposes
// what it did for metrics.
//
// # Transactions
//
// [Limiter.AllowTx] decides inside the caller's transaction, so a cooldown
// is consumed only if the caller's work commits. It is sound for every
// strategy at READ COMMITTED, the PostgreSQL default. While that transaction
// is open, other requests for the key wait for it, up to [Config.Timeout]
// (NoWait refuses them instead, once the key has a committed row), so keep
// such transactions short.
// The admission is dated when AllowTx runs, not when the transaction commits.
// At REPEATABLE READ or SERIALIZABLE, a key decided concurrently yields a
// serialization failure (SQLSTATE 40001) rather than a decision: no
// over-admission, but the caller must retry.
package pglimit
