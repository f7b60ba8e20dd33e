package pglimitclean

import "github.com/pglimit/cooldown/pglimit/internal/lockid"

// Hooks exposes the cleaner's test hooks to package pglimitclean_test.
// Each runs synchronously on the cleaner's goroutines.
type Hooks struct {
	BatchStart func(table string)
	BatchEnd   func(table string, rows int64, err error)
	Leader     func(leader bool)
	Stopping   func()
	BatchWait  func(table string)
}

// SetHooks makes a cleaner built from cfg call h.
func SetHooks(cfg *Config, h Hooks) {
	cfg.hooks = &hooks{batchStart: h.BatchStart, batchEnd: h.BatchEnd, leader: h.Leader, stopping: h.Stopping, batchWait: h.BatchWait}
}

// LockKey is the advisory lock key the cleaners of schema and tables
// (none: the default tables) compete for.
func LockKey(schema string, tables ...string) int64 {
	c, _ := (&Config{Schema: schema, Tables: tables}).withDefaults()
	return lockid.Cleanup(c.Schema, c.Tables)
}
