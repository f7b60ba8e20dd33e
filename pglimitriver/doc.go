// Package pglimitriver limits River jobs (github.com/riverqueue/river) with
// pglimit, in the database River already uses: a worker middleware that
// decides each job before it runs, at a rate, a quota or several limits
// per key, and holds a pglimitsem slot of the job's key while it runs.
//
// A job the limits refuse reserves its units and is snoozed until they
// are due, once, then runs on them without deciding again (units more
// than Config.MaxReserve away are refused, and the job is snoozed until
// they are within it; Config.NoReserve snoozes until the refusal's
// RetryAfter and decides again). A snooze uses up no attempt and counts
// as no error. A job that runs and fails keeps its units or gives them
// back, as Config.RefundOnError says; units reserved for later stay
// spent.
// Limiting the insertion of jobs needs no middleware: decide with
// pglimit's AllowTx in the transaction of River's InsertTx, and the job
// and its charge commit or roll back together (docs/jobs.md).
package pglimitriver
