package pglimit

import (
	"reflect"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/engine"
)

// The root's operations and strategies are the capability table's, by
// name: the root asks it with engine.Op(op) and engine.Strategy(s).
func TestOpsAreTheTables(t *testing.T) {
	t.Parallel()
	for op, want := range map[Op]engine.Op{
		OpAllow: engine.Allow, OpAllowN: engine.AllowN, OpAllowTx: engine.AllowTx, OpAllowTxN: engine.AllowTxN,
		OpAllowAtMost: engine.AllowAtMost, OpReserve: engine.Reserve, OpAllowAll: engine.AllowAll,
		OpPeek: engine.Peek, OpReset: engine.Reset, OpRefund: engine.Refund, OpRefundID: engine.RefundID,
		OpSettle: engine.Settle, OpSettleID: engine.SettleID, OpPause: engine.Pause, OpInspect: engine.Inspect,
		OpLimitedKeys: engine.LimitedKeys, OpSetKeyLimits: engine.SetKeyLimits,
		OpSetKeyLimitsFor: engine.SetKeyLimitsFor, OpListKeyLimits: engine.ListKeyLimits,
	} {
		if engine.Op(op) != want {
			t.Errorf("Op %q is not the table's %q", op, want)
		}
	}
	for s, want := range map[Strategy]engine.Strategy{Upsert: engine.Upsert, NoWait: engine.NoWait, Range: engine.Range} {
		if engine.Strategy(s) != want {
			t.Errorf("Strategy %q is not the table's %q", s, want)
		}
	}
}

// capsOf reads every facet the table needs from a Config.
func TestCapsOf(t *testing.T) {
	t.Parallel()
	c, err := (&Config{Strategy: NoWait, Overrides: true, Shadow: true, Schema: "s", Namespace: "n", Limits: []Limit{
		{Name: "a", Rate: 10, Period: time.Second, Debt: 5},
		{Name: "b", Rate: 100, Algorithm: FixedWindow, Calendar: "month"},
	}}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	got := capsOf(c, `"s"."t"`)
	want := engine.Shape{Strategy: engine.NoWait, Overrides: true, Shadow: true, Schema: "s", Table: `"s"."t"`, Limits: []engine.Limit{
		{Name: "a", Algorithm: "gcra", GCRA: true, Debt: true},
		{Name: "b", Algorithm: "fixed_window", Calendar: true},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("capsOf = %+v, want %+v", got, want)
	}
}
