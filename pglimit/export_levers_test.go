package pglimit

import (
	"time"
)

// PreBlocks reports whether lim's pre-block refuses key now, without a
// round trip.
func PreBlocks(lim Limiter, key string) bool {
	return lim.(*limiter).preblock.Remaining(key, time.Now()) > 0
}

// BatchFailures is how many of lim's batch statements failed; -1 when lim
// does not batch.
func BatchFailures(lim Limiter) int64 {
	l, ok := lim.(*limiter)
	if !ok || l.batch == nil {
		return -1
	}
	return l.batch.Failures()
}

// BatchPending is how many calls wait in lim's open batch.
func BatchPending(lim Limiter) int { return lim.(*limiter).batch.Pending() }

// SetBatchSize sets how many keys fill lim's batch, so that a test decides
// when a batch is sent.
func SetBatchSize(lim Limiter, size int) { lim.(*limiter).batch.SetSize(size) }

// BatchLevel is how many statements lim runs at once now before calls
// gather in a batch: 2 until it has measured some.
func BatchLevel(lim Limiter) int { return lim.(*limiter).batch.Level() }

// Statements returns the SQL of lim's statements that run outside a
// caller's transaction, by name: "allow" (a single GCRA limit's), "general"
// (AllowN of any limits), "peek", "reset" and, when lim batches, "batch",
// "batchwait" (one key, waiting for its lock) and "giveback" (a lease's
// tail).
func Statements(lim Limiter) map[string]string {
	l := lim.(*limiter)
	s := map[string]string{"allow": l.plain.Fast, "peek": l.plain.Peek, "reset": l.keySQL.Reset, "inspect": l.keySQL.Inspect}
	if l.cfg.Strategy != Range {
		// AllowAll of two keys of lim, in lock order.
		s["hierarchy"] = hierarchySQL([]level{{l: l, key: "k1"}, {l: l, key: "k2", index: 1}}, false, false)
	}
	if l.plain.General != nil {
		s["general"] = l.plain.General.Own[modeAllow]
	}
	switch c := l.batch.Config(); {
	case l.batch != nil && c.General:
		s["generalbatch"], s["generalbatchwait"] = c.SQL, c.WaitSQL
	case l.batch != nil:
		s["batch"], s["batchwait"], s["giveback"] = c.SQL, c.WaitSQL, c.BackSQL
	}
	return s
}

// DecisionLeased reports whether d handed out units of a lease.
func DecisionLeased(d Decision) bool { return d.leased }

// LeaseUnits is how many units of key lim's lease holds now.
func LeaseUnits(lim Limiter, key string) int64 { return lim.(*limiter).batch.LeaseUnits(key) }

// GivenBack is how many units of its leases lim has given back.
func GivenBack(lim Limiter) int64 { return lim.(*limiter).batch.GivenBack() }

// GiveBackFailures is how many of lim's give-backs failed.
func GiveBackFailures(lim Limiter) int64 { return lim.(*limiter).batch.GiveBackFailures() }
