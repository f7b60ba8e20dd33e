package pglimit_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// Every operation on a key that decides nothing reads the capability
// table before its arguments: one the limiter cannot do (here, on the
// Range strategy) is ErrUnsupported whatever its arguments, bad ones
// among them, and sends no statement.
func TestDoorUnsupportedBeforeArguments(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := &testdb.Counted{DB: testdb.Pool(t)}
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
	before := db.Statements()
	for name, call := range calls {
		if err := call(); !errors.Is(err, pglimit.ErrUnsupported) {
			t.Errorf("%s on Range with bad arguments: %v, want ErrUnsupported", name, err)
		}
	}
	if n := db.Statements() - before; n != 0 {
		t.Errorf("%d statements sent, want none", n)
	}
}
