package engine

import (
	"errors"
	"slices"
	"testing"

	"github.com/pglimit/cooldown/pglimit/internal/fault"
)

// ops is every operation: the table's rows.
var ops = []Op{Allow, AllowN, AllowTx, AllowTxN, AllowAtMost, Reserve, AllowAll, Peek, Reset,
	Refund, RefundID, Settle, SettleID, Pause, Inspect, LimitedKeys, SetKeyLimits,
	SetKeyLimitsFor, ListKeyLimits, Open, Distribute}

// decisionOps are the decision methods but Reserve and Peek, whose rows
// are one.
var decisionOps = []Op{Allow, AllowN, AllowTx, AllowTxN, AllowAtMost}

var (
	cooldown = Limit{Name: "cooldown", Algorithm: "gcra", GCRA: true}
	perHour  = Limit{Name: "100-per-1h0m0s", Algorithm: "gcra", GCRA: true}
	window   = Limit{Name: "win", Algorithm: "sliding_window"}
	monthly  = Limit{Name: "1000-per-month", Algorithm: "fixed_window", Calendar: true}
	debt     = Limit{Name: "tokens", Algorithm: "gcra", GCRA: true, Debt: true}
)

// shape is a Shape with the message fields every cell shares.
func shape(s Strategy, limits ...Limit) Shape {
	return Shape{Strategy: s, Limits: limits, Schema: "public", Table: `"public"."t"`, Level: 2}
}

// with returns s changed by f.
func with(s Shape, f func(*Shape)) Shape { f(&s); return s }

func id(s *Shape)          { s.ID = true }
func overrides(s *Shape)   { s.Overrides = true }
func shadow(s *Shape)      { s.Shadow = true }
func leased(s *Shape)      { s.Leased = true }
func oneServer(s *Shape)   { s.Deployment = OneServer }
func distributed(s *Shape) { s.Deployment = Distributed }
func bare(s *Shape)        { s.Deployment = DistributedBare }
func noCitus(s *Shape)     { s.Deployment = NoCitus }

// both applies f and g.
func both(f, g func(*Shape)) func(*Shape) { return func(s *Shape) { f(s); g(s) } }

// Messages the cells below share, after "pglimit: unsupported: ".
const (
	idRange       = "a decision id on the range strategy or with Overrides (not yet)"
	idUpsert      = "a decision id on the upsert strategy or with Overrides (not yet)"
	idCitus       = "a decision id on a table Citus distributes (not yet)"
	pauseShape    = "Pause needs one GCRA limit without per-key limits on the Upsert or NoWait strategy"
	bareMsg       = `"public"."t" is a Citus distributed table without pglimit's functions; run pglimit.Distribute on schema public`
	windowsCitus  = "calendar windows and per-key limits on a Citus distributed table"
	debtCitus     = `limit tokens has a Debt, on "public"."t", a Citus distributed table`
	inspectRange  = " on the Range strategy, whose rows are admissions; use Peek"
	refundIDRange = "RefundID on the range strategy or with Overrides (not yet)"
	settleIDRange = "SettleID on the range strategy or with Overrides (not yet)"
)

// every maps each of ops to msg.
func every(msg string, ops ...Op) map[Op]string {
	m := map[Op]string{}
	for _, op := range ops {
		m[op] = msg
	}
	return m
}

// join merges the maps; a later one's cell wins.
func join(ms ...map[Op]string) map[Op]string {
	out := map[Op]string{}
	for _, m := range ms {
		for op, msg := range m {
			out[op] = msg
		}
	}
	return out
}

// allLimiterOps is every operation of a limiter's table (all but
// Distribute).
var allLimiterOps = slices.DeleteFunc(slices.Clone(ops), func(op Op) bool { return op == Distribute })

// Check answers every cell of the table: each shape below, with every
// operation; an operation a shape's map does not name works on it (nil).
func TestCheckTable(t *testing.T) {
	rangeRows := map[Op]string{
		Reserve:  "Reserve on the range strategy",
		AllowAll: "AllowAll on the Range strategy (charges[2])",
		Refund:   "Refund on the range strategy", Settle: "Settle on the range strategy",
		RefundID: refundIDRange, SettleID: settleIDRange,
		Inspect: "Inspect" + inspectRange, LimitedKeys: "LimitedKeys" + inspectRange,
		Pause: pauseShape,
	}
	overridesRows := map[Op]string{
		RefundID: "RefundID on the upsert strategy or with Overrides (not yet)",
		SettleID: "SettleID on the upsert strategy or with Overrides (not yet)",
		Pause:    pauseShape,
	}
	distributedRows := map[Op]string{
		AllowAll: `AllowAll on a table Citus distributes ("public"."t")`,
		Refund:   "Refund on a Citus distributed table", Settle: "Settle on a Citus distributed table",
		RefundID: "RefundID on a Citus distributed table", SettleID: "SettleID on a Citus distributed table",
		Pause: "Pause on a Citus distributed table",
	}
	upsert := shape(Upsert, cooldown)
	for _, tc := range []struct {
		name string
		s    Shape
		want map[Op]string
	}{
		// The strategies and limit sets, on a deployment not looked up yet.
		{"upsert, a cooldown", upsert, nil},
		{"nowait, a cooldown", shape(NoWait, cooldown), nil},
		{"range, a cooldown", shape(Range, cooldown), rangeRows},
		{"upsert, two GCRA limits", shape(Upsert, cooldown, perHour), map[Op]string{Pause: pauseShape}},
		{"upsert, a sliding window", shape(Upsert, window), map[Op]string{
			Reserve: `Reserve on limit "win", which is sliding_window, not GCRA`, Pause: pauseShape}},
		{"nowait, a GCRA limit and a calendar window", shape(NoWait, perHour, monthly), map[Op]string{
			Reserve: `Reserve on limit "1000-per-month", which is fixed_window, not GCRA`, Pause: pauseShape}},
		{"upsert, a limit with a Debt", shape(Upsert, debt), nil},
		{"upsert, Overrides", with(upsert, overrides), overridesRows},
		{"upsert, shadow mode", with(upsert, shadow), nil},

		// A decision id, where the call reads one.
		{"upsert, an id", with(upsert, id), nil},
		{"range, an id", with(shape(Range, cooldown), id), join(rangeRows, every(idRange, decisionOps...))},
		{"upsert, Overrides, an id", with(upsert, both(overrides, id)), join(overridesRows,
			every(idUpsert, append(slices.Clone(decisionOps), Reserve)...),
			map[Op]string{AllowAll: "a decision id on AllowAll with charges[2] on the upsert strategy or with Overrides (not yet)"})},
		{"upsert, shadow mode, an id", with(upsert, both(shadow, id)), map[Op]string{
			AllowAll: "a decision id on AllowAll with charges[2] in shadow mode (not yet)"}},
		{"upsert, a sliding window, an id", with(shape(Upsert, window), id), map[Op]string{
			Reserve: `Reserve on limit "win", which is sliding_window, not GCRA`, Pause: pauseShape}},

		// A decision whose units came from a lease.
		{"upsert, leased", with(upsert, leased), map[Op]string{
			Refund: "Refund of units served from a lease", Settle: "Settle of units served from a lease"}},
		{"range, leased", with(shape(Range, cooldown), leased), rangeRows},

		// The deployments.
		{"upsert, one server", with(upsert, oneServer), nil},
		{"upsert, distributed", with(upsert, distributed), distributedRows},
		{"range, distributed", with(shape(Range, cooldown), distributed), rangeRows},
		{"upsert, distributed, an id", with(upsert, both(distributed, id)), join(distributedRows,
			every(idCitus, append(slices.Clone(decisionOps), Reserve)...))},
		{"upsert, distributed, leased", with(upsert, both(distributed, leased)), distributedRows},
		{"upsert, distributed without the functions", with(upsert, bare), every(bareMsg, allLimiterOps...)},
		{"upsert, distributed, a Debt", with(shape(Upsert, debt), distributed),
			join(every(debtCitus, allLimiterOps...), distributedRows)},
		{"upsert, distributed, a Debt and a calendar window", with(shape(Upsert, debt, monthly), distributed),
			join(every(debtCitus, allLimiterOps...), distributedRows, map[Op]string{
				Reserve: `Reserve on limit "1000-per-month", which is fixed_window, not GCRA`, Pause: pauseShape})},
		{"upsert, distributed, a calendar window", with(shape(Upsert, perHour, monthly), distributed),
			join(every(windowsCitus, allLimiterOps...), distributedRows, map[Op]string{
				Reserve: `Reserve on limit "1000-per-month", which is fixed_window, not GCRA`, Pause: pauseShape})},
		{"upsert, distributed, Overrides", with(upsert, both(distributed, overrides)),
			join(every(windowsCitus, allLimiterOps...), distributedRows, overridesRows)},
		{"no citus extension", with(upsert, noCitus), map[Op]string{
			Distribute: "distribute: the citus extension is not installed in this database (CREATE EXTENSION citus, on a Citus cluster's coordinator)"}},
	} {
		for _, op := range ops {
			err := Check(op, tc.s)
			want, unsupported := tc.want[op]
			switch {
			case !unsupported && err != nil:
				t.Errorf("%s, %s: %v, want nil", tc.name, op, err)
			case unsupported && !errors.Is(err, fault.ErrUnsupported):
				t.Errorf("%s, %s: %v, want ErrUnsupported", tc.name, op, err)
			case unsupported && err.Error() != "pglimit: unsupported: "+want:
				t.Errorf("%s, %s:\n got %q\nwant %q", tc.name, op, err, "pglimit: unsupported: "+want)
			}
		}
	}
}

// Distribute answers only for its own deployment: no limiter's facet
// refuses it.
func TestDistributeReadsOnlyTheExtension(t *testing.T) {
	for _, dep := range []Deployment{Unchecked, OneServer, Distributed, DistributedBare} {
		s := with(shape(Range, debt, monthly), both(overrides, both(shadow, both(id, leased))))
		s.Deployment = dep
		if err := Check(Distribute, s); err != nil {
			t.Errorf("Distribute on deployment %d: %v", dep, err)
		}
	}
}
