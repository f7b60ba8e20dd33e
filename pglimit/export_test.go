package pglimit

import (
	"context"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/engine"
)

// NoWaitPatience is how long NoWait waits for a row lock that another
// decision holds.
const NoWaitPatience = noWaitPatience

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
	s := engine.Citus(specOf(l.cfg))
	l.dist.Store(&s)
}

// SetRecordRetry makes a limiter built from cfg try a failed record of its
// policy again after d instead of a minute.
func SetRecordRetry(cfg *Config, d time.Duration) { cfg.recordRetry = d }
