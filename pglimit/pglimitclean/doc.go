// Package pglimitclean deletes the rows of ended limits: the cleanup job
// that every instance of an application runs beside its limiters.
//
// The Range table gains a row per admission, the Upsert and NoWait tables
// a row per key ever seen, a semaphore's table a row per slot, and the
// decision ids a row per id. A row whose limits ended means the same as
// no row. Run a [Cleaner] in every instance: they elect one leader
// through a PostgreSQL session advisory lock, and only the leader deletes,
// in batches, rows whose limits ended more than [Config.Retention] ago.
// [Cleaner.Stats] counts what it did, for metrics (pglimitprom's
// NewCleanerCollector), and [Inspect] reads from the database which
// session leads and how far behind each table is (the pglimit command's
// cleanup subcommand). docs/operations.md, "Cleanup", has the bounds.
//
// It is a package of its own so that a program that only decides (Migrate,
// New, Allow) links neither it nor its scheduler.
package pglimitclean
