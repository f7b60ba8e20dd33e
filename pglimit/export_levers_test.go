package pglimit

import (
	"time"

	"github.com/jackc/pgx/v5"
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
	l.batch.mu.Lock()
	defer l.batch.mu.Unlock()
	return l.batch.failures
}

// BatchPending is how many calls wait in lim's open batch.
func BatchPending(lim Limiter) int {
	b := lim.(*limiter).batch
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, e := range b.open {
		n += len(e.calls)
	}
	return n
}

// SetBatchSize sets how many keys fill lim's batch, so that a test decides
// when a batch is sent.
func SetBatchSize(lim Limiter, size int) {
	lim.(*limiter).batch.size = size
}

// InFlightLimit is how many statements a limiter runs at once before calls
// gather in a batch.
const InFlightLimit = inFlightLimit

// Statements returns the SQL of lim's statements that run outside a
// caller's transaction, by name: "allow" (a single GCRA limit's), "general"
// (AllowN of any limits), "peek", "reset" and, when lim batches, "batch",
// "batchwait" (one key, waiting for its lock) and "giveback" (a lease's
// tail).
func Statements(lim Limiter) map[string]string {
	l := lim.(*limiter)
	s := map[string]string{"allow": l.plain.fast, "peek": l.plain.peek, "reset": l.resetSQL, "inspect": inspectSQL(l.cfg)}
	if l.cfg.Strategy != Range {
		// AllowAll of two keys of lim, in lock order.
		table := pgx.Identifier{l.cfg.Schema, l.cfg.Table}.Sanitize()
		s["hierarchy"] = hierarchySQL([]level{{l: l, key: "k1", table: table}, {l: l, key: "k2", index: 1, table: table}}, false)
	}
	if l.plain.general != nil {
		s["general"] = l.plain.general.own[modeAllow]
	}
	switch {
	case l.batch != nil && l.batch.general:
		s["generalbatch"], s["generalbatchwait"] = l.batch.sql, l.batch.waitSQL
	case l.batch != nil:
		s["batch"], s["batchwait"], s["giveback"] = l.batch.sql, l.batch.waitSQL, l.batch.backSQL
	}
	return s
}

// DecisionLeased reports whether d handed out units of a lease.
func DecisionLeased(d Decision) bool { return d.leased }

// LeaseUnits is how many units of key lim's lease holds now.
func LeaseUnits(lim Limiter, key string) int64 {
	b := lim.(*limiter).batch
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.leases == nil || b.leases.keys[key] == nil {
		return 0
	}
	return b.leases.keys[key].expire(time.Now(), b.leases.unit)
}

// GivenBack is how many units of its leases lim has given back.
func GivenBack(lim Limiter) int64 {
	b := lim.(*limiter).batch
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.givenBack
}
