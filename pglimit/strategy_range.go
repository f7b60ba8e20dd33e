package pglimit

import (
	"context"
	"fmt"

	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// Range inserts [now, now+cooldown) into a table whose exclusion
// constraint forbids two overlapping ranges for one key (range.allow).
func newRange(l *limiter, table string) Limiter {
	newStmtLimiter(l, table, "range.allow", "", "")
	l.plain.peek = queries.Text("range.peek", queries.Args{"table": table})
	l.verify = func(ctx context.Context, db DB) error { return verifyExclusion(ctx, db, table) }
	return l
}

// verifyExclusion fails with ErrNoExclusionConstraint when the Range
// table has lost its exclusion constraint, which is the limiter: without
// it every request is admitted (range.exclusion_exists).
func verifyExclusion(ctx context.Context, db DB, table string) error {
	var ok bool
	if err := db.QueryRow(ctx, queries.Static("range.exclusion_exists"), table).Scan(&ok); err != nil {
		return fmt.Errorf("check the exclusion constraint of %s: %w", table, err)
	}
	if !ok {
		return fmt.Errorf("%w: %s", ErrNoExclusionConstraint, table)
	}
	return nil
}
