// Package pglimitsem limits how many requests of a key are in flight at
// once, across every instance of an application: a concurrency limit, kept
// in PostgreSQL like pglimit's rate limits.
//
// A rate or a cooldown says how often a key may start work; a semaphore
// says how much of it may run at the same time, which is what matters for
// work whose cost is its duration ("at most 2 exports running per user").
// A caller acquires a slot before the work and releases it after; a slot
// its holder never releases (a killed process, a lost connection) returns
// by itself when its lease ends.
//
// The slots live in pglimit_slots, which [pglimit.Migrate] creates and
// [pglimitclean.Cleaner] cleans. pglimithttp.Concurrency holds a slot for the
// length of an HTTP request.
//
// [Semaphore.Wait] queues for a slot in arrival order; [Semaphore.WaitFlow]
// queues as a waiter of a flow (a tenant) with a weight, and shares the
// key's slots among the flows that wait in proportion to their weights.
// [Semaphore.AcquireLevel] acquires for a priority level of
// [Config.Levels], each with a guaranteed share that it may lend.
package pglimitsem
