package pglimit

import (
	"context"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/lockid"
)

// CleanerHooks exposes the cleaner's test hooks to package pglimit_test.
// Each runs synchronously on the cleaner's goroutines.
type CleanerHooks struct {
	BatchStart func(table string)
	BatchEnd   func(table string, rows int64, err error)
	Leader     func(leader bool)
	Stopping   func()
	BatchWait  func(table string)
}

// SetCleanerHooks makes a cleaner built from cfg call h.
func SetCleanerHooks(cfg *CleanerConfig, h CleanerHooks) {
	cfg.hooks = &cleanerHooks{batchStart: h.BatchStart, batchEnd: h.BatchEnd, leader: h.Leader, stopping: h.Stopping, batchWait: h.BatchWait}
}

// CleanerLockKey is the advisory lock key the cleaners of schema and
// tables (none: the default tables) compete for.
func CleanerLockKey(schema string, tables ...string) int64 {
	c, _ := (&CleanerConfig{Schema: schema, Tables: tables}).withDefaults()
	return lockid.Cleanup(c.Schema, c.Tables)
}

// DecisionAt is the database time a decision used, in microseconds since
// the Unix epoch; 0 when it did not come from the database.
func DecisionAt(d Decision) int64 { return d.at }

// CreateFunctions creates, on plain PostgreSQL, the PL/pgSQL functions
// that Distribute installs for table in schema on a Citus cluster.
func CreateFunctions(ctx context.Context, db DB, schema, table string) error {
	_, err := createFunctions(ctx, db, schema, table)
	return err
}

// UseFunctions switches lim to those functions, as a limiter does once it
// finds its table distributed.
func UseFunctions(lim Limiter) {
	l := lim.(*limiter)
	s := l.distributedStatements()
	l.dist.Store(&s)
}

// SetRecordRetry makes a limiter built from cfg try a failed record of its
// policy again after d instead of a minute.
func SetRecordRetry(cfg *Config, d time.Duration) { cfg.recordRetry = d }
