package pglimit_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// everyStatementDB counts every statement sent through it.
type everyStatementDB struct {
	pglimit.DB
	statements atomic.Int64
}

func (c *everyStatementDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.statements.Add(1)
	return c.DB.QueryRow(ctx, sql, args...)
}

func (c *everyStatementDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.statements.Add(1)
	return c.DB.Exec(ctx, sql, args...)
}

// Every operation on a key that decides nothing reads the capability
// table before its arguments: one the limiter cannot do (here, on the
// Range strategy) is ErrUnsupported whatever its arguments, bad ones
// among them, and sends no statement.
func TestDoorUnsupportedBeforeArguments(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := &everyStatementDB{DB: testdb.Pool(t)}
	rng := newLimiterOn(t, db, pglimit.Config{Schema: testdb.Schema(t), Strategy: pglimit.Range, Cooldown: time.Hour})
	calls := map[string]func() error{
		"Pause":       func() error { return pglimit.Pause(ctx, rng, "", 0) },
		"Inspect":     func() error { _, err := pglimit.Inspect(ctx, rng, ""); return err },
		"LimitedKeys": func() error { _, err := pglimit.LimitedKeys(ctx, rng, 0, "", 0); return err },
		"Refund":      func() error { _, err := rng.Refund(ctx, pglimit.Decision{}, 0); return err },
		"Settle":      func() error { _, err := pglimit.Settle(ctx, rng, pglimit.Decision{}, -1); return err },
		"RefundID":    func() error { _, err := pglimit.RefundID(ctx, rng, "", 0); return err },
		"SettleID":    func() error { _, err := pglimit.SettleID(ctx, rng, "", -1); return err },
	}
	before := db.statements.Load()
	for name, call := range calls {
		if err := call(); !errors.Is(err, pglimit.ErrUnsupported) {
			t.Errorf("%s on Range with bad arguments: %v, want ErrUnsupported", name, err)
		}
	}
	if n := db.statements.Load() - before; n != 0 {
		t.Errorf("%d statements sent, want none", n)
	}
}
