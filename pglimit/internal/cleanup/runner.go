package cleanup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/leadership"
)

// Runner runs the cleanups of the elected leader: every table, batch after
// batch, each batch on the leader's connection. It keeps the counts the
// Cleaner's Stats reports.
type Runner struct {
	Elector      *leadership.Elector
	Retention    time.Duration // a row is deleted once its limits ended this long ago
	BatchSize    int           // the most rows one DELETE removes
	BatchTimeout time.Duration // the statement_timeout of a batch, set on the leader's connection
	Logger       *slog.Logger
	Hooks        *Hooks          // nil outside tests
	Stopping     <-chan struct{} // closed when the cleaner stops: no batch begins after

	// Ended, when set, is called at the end of each run with the rows it
	// deleted, how long it took and why it stopped early, if it did.
	Ended func(ctx context.Context, rows int64, took time.Duration, err error)

	Runs, Batches, RowsDeleted, Errors atomic.Uint64
	LastSuccess, LastDuration          atomic.Int64 // UnixNano; nanoseconds
}

// Hooks let tests wait for a run's events instead of sleeping; each runs
// synchronously on the runner's goroutine.
type Hooks struct {
	BatchWait  func(table string)                        // a batch is about to wait for the leader's connection
	BatchStart func(table string)                        // on the leader's connection, before the DELETE
	BatchEnd   func(table string, rows int64, err error) // after it
}

// batchClientTimeoutMargin is how long past BatchTimeout a batch waits for
// the server's own timeout before giving up on a silent network.
const batchClientTimeoutMargin = 2 * time.Second

// stopping reports whether the cleaner is stopping.
func (r *Runner) stopping() bool {
	select {
	case <-r.Stopping:
		return true
	default:
		return false
	}
}

// Run is one cleanup: every table, batch after batch. ctx ends only when
// the cleaner's Stop runs out of grace.
func (r *Runner) Run(ctx context.Context, tables []Table) {
	if r.stopping() {
		return // the tick and stop came together
	}
	r.Runs.Add(1)
	start := time.Now()
	var deleted int64
	err := r.sweep(ctx, tables, &deleted)
	end := time.Now()
	r.LastDuration.Store(int64(end.Sub(start)))
	if r.Ended != nil {
		r.Ended(ctx, deleted, end.Sub(start), err)
	}
	switch {
	case errors.Is(err, leadership.ErrNotLeader):
		r.Logger.Debug("pglimit: cleanup run ended: leadership lost", "rows", deleted)
	case errors.Is(err, errCancelled):
		r.Logger.Info("pglimit: cleanup run cancelled by Stop", "rows", deleted)
	case err != nil:
		r.Logger.Error("pglimit: cleanup run failed", "rows", deleted, "err", err)
	default:
		r.LastSuccess.Store(end.UnixNano())
		r.Logger.Debug("pglimit: cleanup run", "rows", deleted, "duration", end.Sub(start))
	}
}

// sweep deletes batches from each table until a batch comes back short (or,
// for a table swept by blocks, until the blocks it had when the run began
// are done), or the cleaner stops.
func (r *Runner) sweep(ctx context.Context, tables []Table, deleted *int64) error {
	for _, t := range tables {
		if t.Sweep {
			if err := r.sweepBlocks(ctx, t, deleted); err != nil {
				return err
			}
			continue
		}
		for !r.stopping() {
			n, err := r.batch(ctx, t, func(ctx context.Context, conn *pgx.Conn) (int64, error) {
				return t.DeleteBatch(ctx, conn, r.Retention, r.BatchSize)
			})
			*deleted += n
			if err != nil {
				return err
			}
			if n < int64(r.BatchSize) {
				break
			}
		}
	}
	return nil
}

// sweepBlocks cleans a table without an index on expires_at, which keeps
// its updates HOT, in batches of BatchSize/sweepRowsPerBlock blocks: a
// batch reads those blocks only, and one run reads the table once. A batch that deletes
// BatchSize rows is run again on the same blocks.
func (r *Runner) sweepBlocks(ctx context.Context, t Table, deleted *int64) error {
	span := int64(max(r.BatchSize/sweepRowsPerBlock, 1))
	for from, end := int64(0), int64(-1); (end < 0 || from < end) && !r.stopping(); {
		var blocks int64
		n, err := r.batch(ctx, t, func(ctx context.Context, conn *pgx.Conn) (n int64, err error) {
			n, blocks, err = t.DeleteBlocks(ctx, conn, r.Retention, from, from+span, r.BatchSize)
			return n, err
		})
		*deleted += n
		if err != nil {
			return err
		}
		if end < 0 {
			end = blocks // rows stored later wait for the next run
		}
		if n < int64(r.BatchSize) {
			from += span
		}
	}
	return nil
}

// sweepRowsPerBlock sizes a block sweep's batch: a block of the Upsert or
// NoWait table holds about 60 to 100 rows, so a batch of BatchSize/16
// blocks reads a few times BatchSize rows, most of them live.
const sweepRowsPerBlock = 16

// errCancelled ends a run whose batch Stop cancelled.
var errCancelled = errors.New("batch cancelled by Stop")

// batch runs one DELETE, del, of table t on the leader's connection. runCtx
// ends when Stop's grace runs out.
func (r *Runner) batch(runCtx context.Context, t Table, del func(ctx context.Context, conn *pgx.Conn) (int64, error)) (int64, error) {
	// statement_timeout ends a slow batch on the server and keeps the
	// connection; this deadline is only a backstop for a silent network.
	ctx, cancel := context.WithTimeout(runCtx, r.BatchTimeout+batchClientTimeoutMargin)
	defer cancel()
	if h := r.Hooks; h != nil && h.BatchWait != nil {
		h.BatchWait(t.Name)
	}
	var n int64
	err := r.Elector.Do(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		if h := r.Hooks; h != nil && h.BatchStart != nil {
			h.BatchStart(t.Name)
		}
		var err error
		n, err = del(ctx, conn)
		if h := r.Hooks; h != nil && h.BatchEnd != nil {
			h.BatchEnd(t.Name, n, err)
		}
		return err
	})
	switch {
	case errors.Is(err, leadership.ErrNotLeader):
		return 0, err
	case err != nil && runCtx.Err() != nil:
		return 0, errCancelled // Stop's grace ran out: not a failure of the cleanup
	case err != nil:
		r.Errors.Add(1)
		return 0, fmt.Errorf("pglimit: cleanup: %w", err)
	}
	r.Batches.Add(1)
	r.RowsDeleted.Add(uint64(n))
	return n, nil
}
