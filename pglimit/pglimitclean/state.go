package pglimitclean

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/internal/cleanup"
	"github.com/pglimit/cooldown/pglimit/internal/fault"
	"github.com/pglimit/cooldown/pglimit/internal/lockid"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// State is what the database shows of the cleaners that a [Config]
// configures, in every instance: which session leads them, and how far
// behind they are on each table. [Inspect] reads it.
type State struct {
	// Leader is the session that holds the leader's lock; nil if none
	// does: no instance runs a [Cleaner] of this configuration, or its
	// leader has just died and another takes over within an election
	// interval.
	Leader *Leader
	Tables []TableState
}

// Leader is the database session of the leading cleaner.
type Leader struct {
	PID int // its server process id
	// Application is its connection's application_name; Connected and
	// Active are when its connection began and when its state last changed
	// (when idle, the end of its last batch). They are known only to a
	// role that may see the session (its own role, or pg_read_all_stats),
	// else empty and zero.
	Application       string
	Connected, Active time.Time
}

// TableState is one cleaned table's size and backlog.
type TableState struct {
	Table string // its name in the schema
	Bytes int64  // on disk, indexes included
	Rows  int64  // estimated by the last ANALYZE; 0 if never analysed
	// Due is how many rows the next run deletes: their limits ended more
	// than Retention ago.
	Due int64
	// Overdue is how long ago the oldest of them became due: how far behind
	// the cleaner is. Up to an Interval (and a run's length) is its normal
	// pace; much more means no leader, or runs that fail or cannot keep
	// up. Zero if none is due.
	Overdue time.Duration
}

// Inspect returns which session leads the cleaners cfg configures, and
// each of its tables' size and backlog at cfg's Retention. It reads every
// table whole, so it takes as long as a scan of them: ctx bounds it. A
// table that is missing or not a limiter table is
// [pglimit.ErrInvalidConfig].
func Inspect(ctx context.Context, db pglimit.DB, cfg *Config) (State, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return State{}, err
	}
	var st State
	var (
		leader            Leader
		connected, active *time.Time
	)
	err = db.QueryRow(ctx, queries.Static("cleanup.leader"), lockid.Cleanup(c.Schema, c.Tables)).Scan(&leader.PID, &leader.Application, &connected, &active)
	switch {
	case err == nil:
		if connected != nil {
			leader.Connected = *connected
		}
		if active != nil {
			leader.Active = *active
		}
		st.Leader = &leader
	case !errors.Is(err, pgx.ErrNoRows):
		return State{}, fault.Wrap(ctx, "pglimitclean.Inspect", 0, err)
	}
	for _, name := range c.Tables {
		t, err := cleanup.Describe(ctx, db, c.Schema, name)
		if errors.Is(err, cleanup.ErrNotLimiterTable) {
			return State{}, fmt.Errorf("%w: Inspect: %w", pglimit.ErrInvalidConfig, err)
		} else if err != nil {
			return State{}, fault.Wrap(ctx, "pglimitclean.Inspect", 0, err)
		}
		b, err := t.Backlog(ctx, db, c.Retention)
		if err != nil {
			return State{}, fault.Wrap(ctx, "pglimitclean.Inspect", 0, fmt.Errorf("%s: %w", t.Name, err))
		}
		st.Tables = append(st.Tables, TableState{Table: name, Bytes: b.Bytes, Rows: b.Rows, Due: b.Due, Overdue: time.Duration(b.Overdue) * time.Microsecond})
	}
	return st, nil
}
