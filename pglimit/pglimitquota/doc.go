// Package pglimitquota keeps the quotas plans are sold by: a number of
// units per key and billing period, each key's period anchored at its own
// date, kept in PostgreSQL beside pglimit's rate limits.
//
// A key's period is monthly from a day of the month (clamped to the
// month's end: an anchor of the 31st resets on 28 or 29 February and on
// 30 April) or yearly from a date, at local midnight in the key's time
// zone. [Quota.Allow] charges units against the key's plan in one
// statement: its allowance first, then its credits ([Quota.Grant]),
// earliest expiry first, then overage up to its hard cap, past which it
// refuses. [Quota.SetPlan] sets a key's anchor and plan at runtime, at
// once or from the next period; [Quota.Usage] reports the period.
// [Quota.Forget] deletes a key: its plan, counters, credits and ids, as
// if it had never been seen; its threshold events stay until taken.
//
// # Exactly once
//
// A decision made with [pglimit.WithID] charges its id once: a retry of
// the id, on any instance, while the id is kept (Config.IDRetention),
// returns the first admission with Replayed set and charges nothing. An
// id first refused is decided afresh; an id admitted by [Quota.AllowTx]
// in a transaction that rolled back was never admitted. [Quota.RefundID]
// and [Quota.SettleID] give back or settle an admission by its id, from
// any instance, at most once.
//
// # Thresholds
//
// A decision that crosses a share of the key's allowance
// (Config.Thresholds) writes one row per key, period and threshold to an
// outbox table, in its own statement; [Quota.TakeEvents] consumes them.
// No NOTIFY: a NOTIFY takes a global lock at commit.
//
// The tables are pglimit_quota_keys, pglimit_quota_ids and
// pglimit_quota_events (migration 00015, and 00017, which indexes the
// ids by key; [pglimit.Migrate] applies them). docs/limits.md, "Billing periods", defines every rule.
package pglimitquota
