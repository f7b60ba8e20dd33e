package pglimitquota_test

import (
	"context"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

// Allow decides the common case in one statement (docs/limits.md,
// "Billing periods", Cost): a key whose period holds now and whose
// allowance alone takes the units, crossing no threshold. Every other
// decision takes two: the common case's, which matches no row and writes
// nothing, then the whole one. The common case's answer is the whole
// decision's: credits left, live ones only, and the period.
func TestAllowCommonCaseOneStatement(t *testing.T) {
	start := at(t, "UTC", "2027-03-10 12:00:00")
	b := setup(t, pglimitquota.Config{Allowance: 10, Thresholds: []float64{0.5}}, start)
	db := &testdb.Counted{DB: b.pool}
	q, err := pglimitquota.New(db, &pglimitquota.Config{Schema: b.schema, Namespace: "n", Allowance: 10, Thresholds: []float64{0.5}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	step := func(what string, ctx context.Context, cost int64, statements int64, check func(d pglimitquota.Decision) bool) {
		t.Helper()
		before := db.Statements()
		d, err := q.Allow(ctx, "k", cost)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := db.Statements() - before; n != statements || !check(d) {
			t.Errorf("%s: %d statements, %+v; want %d statements", what, n, d, statements)
		}
	}
	step("a new key", ctx, 1, 2, func(d pglimitquota.Decision) bool { return d.Allowed && d.Usage.Used == 1 })
	if err := b.q.Grant(ctx, "k", 7, start.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	end := at(t, "UTC", "2027-04-10 00:00:00")
	step("the allowance takes it", ctx, 1, 1, func(d pglimitquota.Decision) bool {
		return d.Allowed && d.FromAllowance == 1 && d.Usage.Used == 2 && d.Usage.FromAllowance == 2 && d.Usage.CreditsLeft == 7 &&
			d.Usage.Allowance == 10 && d.Usage.HardCap == 10 && d.Usage.PeriodStart.Equal(start) && d.Usage.PeriodEnd.Equal(end) &&
			d.Usage.Now.Equal(start)
	})
	b.clock.Advance(2 * time.Hour)
	step("once the credit expired", ctx, 1, 1, func(d pglimitquota.Decision) bool {
		return d.Allowed && d.Usage.Used == 3 && d.Usage.CreditsLeft == 0
	})
	idCtx := pglimit.WithID(ctx, "id-1")
	step("with an id", idCtx, 1, 1, func(d pglimitquota.Decision) bool { return d.Allowed && !d.Replayed && d.Usage.Used == 4 })
	step("the id again", idCtx, 1, 3, func(d pglimitquota.Decision) bool { return d.Allowed && d.Replayed && d.Usage.Used == 4 })
	step("crossing half the allowance", ctx, 2, 2, func(d pglimitquota.Decision) bool { return d.Allowed && d.Usage.Used == 6 })
	if n := b.count(t, "pglimit_quota_events"); n != 1 {
		t.Errorf("%d threshold events, want 1", n)
	}
	step("the allowance's last units", ctx, 4, 1, func(d pglimitquota.Decision) bool { return d.Allowed && d.Usage.Used == 10 })
	step("a refusal", ctx, 1, 2, func(d pglimitquota.Decision) bool { return !d.Allowed && d.Usage.Used == 10 })
	if u, err := b.q.Usage(ctx, "k"); err != nil || u.Used != 10 || u.FromAllowance != 10 {
		t.Errorf("Usage: %+v, %v; want the 10 units of the allowance used", u, err)
	}
}
