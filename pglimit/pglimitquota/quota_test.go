package pglimitquota_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"

	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

// A key's first admission anchors it at that day; the allowance, then
// overage up to the hard cap; past it, a refusal that charges nothing.
func TestAllowSoftAndHardCap(t *testing.T) {
	start := at(t, "UTC", "2027-03-10 12:00:00")
	b := setup(t, pglimitquota.Config{Allowance: 10, HardCap: 15}, start)
	ctx := context.Background()
	d := allow(t, ctx, b.q, "k", 8)
	if !d.Allowed || d.FromAllowance != 8 || d.Overage != 0 || d.Usage.Used != 8 {
		t.Fatalf("first: %+v", d)
	}
	if want := at(t, "UTC", "2027-03-10 00:00:00"); !d.Usage.PeriodStart.Equal(start) {
		t.Fatalf("period start %s, want the first admission %s (not %s)", d.Usage.PeriodStart, start, want)
	}
	if want := at(t, "UTC", "2027-04-10 00:00:00"); !d.Usage.PeriodEnd.Equal(want) {
		t.Fatalf("period end %s, want %s", d.Usage.PeriodEnd, want)
	}
	d = allow(t, ctx, b.q, "k", 5)
	if !d.Allowed || d.FromAllowance != 2 || d.Overage != 3 || d.Usage.Overage != 3 || d.Usage.Used != 13 {
		t.Fatalf("into overage: %+v", d)
	}
	before := b.dump(t)
	d = allow(t, ctx, b.q, "k", 3)
	if d.Allowed || d.Usage.Used != 13 || d.FromAllowance+d.FromCredits+d.Overage != 0 {
		t.Fatalf("past the hard cap: %+v", d)
	}
	if after := b.dump(t); after != before {
		t.Fatalf("a refusal wrote:\n%s\nbefore:\n%s", after, before)
	}
	d = allow(t, ctx, b.q, "k", 2)
	if !d.Allowed || d.Usage.Used != 15 || d.Usage.Overage != 5 {
		t.Fatalf("up to the hard cap: %+v", d)
	}
	b.clock.Set(at(t, "UTC", "2027-04-10 00:00:00"))
	u, err := b.q.Usage(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if u.Used != 0 || u.Allowance != 10 || u.HardCap != 15 || !u.PeriodStart.Equal(at(t, "UTC", "2027-04-10 00:00:00")) || !u.PeriodEnd.Equal(at(t, "UTC", "2027-05-10 00:00:00")) {
		t.Fatalf("next period: %+v", u)
	}
}

// clamped is local midnight of day d of month m of year y in loc, the day
// clamped to the month's last.
func clamped(y int, m time.Month, d int, loc *time.Location) time.Time {
	last := time.Date(y, m+1, 0, 0, 0, 0, 0, loc).Day()
	return time.Date(y, m, min(d, last), 0, 0, 0, 0, loc)
}

// Anchors of the 28th to the 31st reset on the clamped day: 28 or 29
// February, 30 April, across a leap (2028) and a common (2027) February;
// a period holds its start and not its end, to the microsecond.
func TestMonthEndClamps(t *testing.T) {
	for _, year := range []int{2027, 2028} {
		for day := 28; day <= 31; day++ {
			t.Run(fmt.Sprintf("%d-%d", year, day), func(t *testing.T) {
				b := setup(t, pglimitquota.Config{Allowance: 5}, time.Date(year-1, 12, 1, 0, 0, 0, 0, time.UTC))
				ctx := context.Background()
				if _, err := b.q.SetPlan(ctx, "k", pglimitquota.Plan{Anchor: pglimitquota.Anchor{Day: day}, Allowance: 5}, pglimitquota.AtOnce); err != nil {
					t.Fatal(err)
				}
				for _, m := range []time.Month{time.February, time.March, time.April, time.May} {
					start := clamped(year, m, day, time.UTC)
					prev, next := clamped(year, m-1, day, time.UTC), clamped(year, m+1, day, time.UTC)
					b.clock.Set(start.Add(-time.Microsecond))
					u, err := b.q.Usage(ctx, "k")
					if err != nil {
						t.Fatal(err)
					}
					if !u.PeriodStart.Equal(prev) || !u.PeriodEnd.Equal(start) {
						t.Errorf("1µs before %s: period [%s, %s), want [%s, %s)", start, u.PeriodStart, u.PeriodEnd, prev, start)
					}
					b.clock.Set(start)
					d := allow(t, ctx, b.q, "k", 1)
					if !d.Usage.PeriodStart.Equal(start) || !d.Usage.PeriodEnd.Equal(next) || d.Usage.Used != 1 {
						t.Errorf("at %s: period [%s, %s) used %d, want [%s, %s) used 1", start, d.Usage.PeriodStart, d.Usage.PeriodEnd, d.Usage.Used, start, next)
					}
				}
				if feb := clamped(year, time.February, day, time.UTC).Day(); year == 2028 && feb != min(day, 29) || year == 2027 && feb != 28 {
					t.Fatalf("February's reset on day %d", feb)
				}
			})
		}
	}
}

// Yearly periods from 29 February reset on 28 February in a common year.
func TestYearlyLeapDay(t *testing.T) {
	b := setup(t, pglimitquota.Config{Period: pglimitquota.Yearly, Allowance: 5}, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	if _, err := b.q.SetPlan(ctx, "k", pglimitquota.Plan{Anchor: pglimitquota.Anchor{Month: time.February, Day: 29}, Allowance: 5}, pglimitquota.AtOnce); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ at, start, end time.Time }{
		{time.Date(2027, 2, 27, 23, 0, 0, 0, time.UTC), time.Date(2026, 2, 28, 0, 0, 0, 0, time.UTC), time.Date(2027, 2, 28, 0, 0, 0, 0, time.UTC)},
		{time.Date(2027, 2, 28, 0, 0, 0, 0, time.UTC), time.Date(2027, 2, 28, 0, 0, 0, 0, time.UTC), time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC)},
		{time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC), time.Date(2029, 2, 28, 0, 0, 0, 0, time.UTC)},
	} {
		b.clock.Set(c.at)
		u, err := b.q.Usage(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if !u.PeriodStart.Equal(c.start) || !u.PeriodEnd.Equal(c.end) {
			t.Errorf("at %s: [%s, %s), want [%s, %s)", c.at, u.PeriodStart, u.PeriodEnd, c.start, c.end)
		}
	}
}

// A key's periods start at local midnight in its own zone, across a DST
// change: New York's period from 10 March 2027 (EST, UTC-5) ends on 10
// April at midnight EDT (UTC-4), 1µs after the last instant it holds.
func TestPeriodDST(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, pglimitquota.Config{Allowance: 5, TimeZone: "Asia/Tokyo"}, time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	if _, err := b.q.SetPlan(ctx, "k", pglimitquota.Plan{Anchor: pglimitquota.Anchor{Day: 10}, TimeZone: "America/New_York", Allowance: 5}, pglimitquota.AtOnce); err != nil {
		t.Fatal(err)
	}
	start, end := time.Date(2027, 3, 10, 0, 0, 0, 0, ny), time.Date(2027, 4, 10, 0, 0, 0, 0, ny)
	if _, off := start.Zone(); off != -5*3600 {
		t.Fatalf("start offset %d", off)
	}
	if _, off := end.Zone(); off != -4*3600 {
		t.Fatalf("end offset %d", off)
	}
	b.clock.Set(end.Add(-time.Microsecond))
	d := allow(t, ctx, b.q, "k", 5)
	if !d.Allowed || !d.Usage.PeriodStart.Equal(start) || !d.Usage.PeriodEnd.Equal(end) {
		t.Fatalf("1µs before the end: %+v, want [%s, %s)", d, start, end)
	}
	if d := allow(t, ctx, b.q, "k", 1); d.Allowed {
		t.Fatalf("past the allowance: %+v", d)
	}
	b.clock.Set(end)
	d = allow(t, ctx, b.q, "k", 5)
	if !d.Allowed || !d.Usage.PeriodStart.Equal(end) || !d.Usage.PeriodEnd.Equal(time.Date(2027, 5, 10, 0, 0, 0, 0, ny)) {
		t.Fatalf("at the end: %+v", d)
	}
	// Tokyo's midnight is 15:00 UTC the day before: a key on the default
	// zone resets then.
	b.clock.Set(time.Date(2027, 4, 20, 3, 0, 0, 0, time.UTC))
	d = allow(t, ctx, b.q, "tokyo", 1)
	tokyo, _ := time.LoadLocation("Asia/Tokyo")
	if want := time.Date(2027, 5, 20, 0, 0, 0, 0, tokyo); !d.Usage.PeriodEnd.Equal(want) {
		t.Fatalf("Tokyo key: end %s, want %s", d.Usage.PeriodEnd, want)
	}
}

// 16 callers over two instances, one through PgBouncer, on the real
// clock, charge one unit at a time: exactly the hard cap is admitted,
// the allowance first, and never more.
func TestHardCapConcurrent(t *testing.T) {
	schema := testdb.Schema(t)
	cfg := pglimitquota.Config{Schema: schema, Namespace: "n", Allowance: 100, HardCap: 150}
	quotas := twoInstances(t, testdb.Pool(t), cfg)
	ctx := context.Background()
	var mu sync.Mutex
	var admitted, fromAllowance, overage int64
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for range 20 {
				d, err := quotas[i%2].Allow(ctx, "k", 1)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Usage.Used > 150 || d.Usage.Overage > 50 {
					t.Errorf("past the hard cap: %+v", d)
				}
				if d.Allowed {
					mu.Lock()
					admitted, fromAllowance, overage = admitted+1, fromAllowance+d.FromAllowance, overage+d.Overage
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if admitted != 150 || fromAllowance != 100 || overage != 50 {
		t.Fatalf("admitted %d (%d from the allowance, %d overage), want 150 (100, 50)", admitted, fromAllowance, overage)
	}
	u, err := quotas[1].Usage(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if u.Used != 150 || u.FromAllowance != 100 || u.Overage != 50 {
		t.Fatalf("usage %+v", u)
	}
}

// Bad input is a typed error and writes nothing.
func TestBadInputWritesNothing(t *testing.T) {
	b := setup(t, pglimitquota.Config{Allowance: 5, Period: pglimitquota.Yearly}, time.Time{})
	ctx := context.Background()
	allow(t, ctx, b.q, "k", 1)
	if err := b.q.Grant(ctx, "k", 3, b.clock.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	plan := func(month time.Month, day int, zone string, allowance, hardCap int64) pglimitquota.Plan {
		return pglimitquota.Plan{Anchor: pglimitquota.Anchor{Month: month, Day: day}, TimeZone: zone, Allowance: allowance, HardCap: hardCap}
	}
	setPlan := func(p pglimitquota.Plan) error {
		_, err := b.q.SetPlan(ctx, "k", p, pglimitquota.AtOnce)
		return err
	}
	for _, c := range []struct {
		name string
		call func() error
		want error
	}{
		{"anchor day 0", func() error { return setPlan(plan(1, 0, "", 5, 0)) }, pglimit.ErrInvalidConfig},
		{"anchor day 32", func() error { return setPlan(plan(1, 32, "", 5, 0)) }, pglimit.ErrInvalidConfig},
		{"anchor month 13", func() error { return setPlan(plan(13, 1, "", 5, 0)) }, pglimit.ErrInvalidConfig},
		{"anchor month 0 on a yearly quota", func() error { return setPlan(plan(0, 1, "", 5, 0)) }, pglimit.ErrInvalidConfig},
		{"unknown zone", func() error { return setPlan(plan(1, 1, "Mars/Olympus_Mons", 5, 0)) }, pglimit.ErrInvalidConfig},
		{"negative allowance", func() error { return setPlan(plan(1, 1, "", -1, 0)) }, pglimit.ErrInvalidConfig},
		{"hard cap under the allowance", func() error { return setPlan(plan(1, 1, "", 5, 4)) }, pglimit.ErrInvalidConfig},
		{"plan of a bad key", func() error {
			_, err := b.q.SetPlan(ctx, "", plan(1, 1, "", 5, 0), pglimitquota.AtOnce)
			return err
		}, pglimit.ErrInvalidKey},
		{"negative credit", func() error { return b.q.Grant(ctx, "k", -1, b.clock.Now().Add(time.Hour)) }, pglimit.ErrInvalidCost},
		{"zero credit", func() error { return b.q.Grant(ctx, "k", 0, b.clock.Now().Add(time.Hour)) }, pglimit.ErrInvalidCost},
		{"credit expired", func() error { return b.q.Grant(ctx, "k", 1, b.clock.Now()) }, pglimit.ErrInvalidCost},
		{"credit of a new key expired", func() error { return b.q.Grant(ctx, "new", 1, b.clock.Now().Add(-time.Microsecond)) }, pglimit.ErrInvalidCost},
		{"zero cost", func() error { _, err := b.q.Allow(ctx, "k", 0); return err }, pglimit.ErrInvalidCost},
		{"negative cost", func() error { _, err := b.q.Allow(ctx, "k", -3); return err }, pglimit.ErrInvalidCost},
		{"cost too large", func() error { _, err := b.q.Allow(ctx, "k", pglimitquota.MaxUnits+1); return err }, pglimit.ErrInvalidCost},
		{"bad key", func() error { _, err := b.q.Allow(ctx, "a\x00b", 1); return err }, pglimit.ErrInvalidKey},
		{"empty id", func() error { _, err := b.q.Allow(pglimit.WithID(ctx, ""), "k", 1); return err }, pglimit.ErrInvalidID},
		{"id too long", func() error {
			_, err := b.q.Allow(pglimit.WithID(ctx, string(make([]byte, pglimit.MaxIDLength+1))), "k", 1)
			return err
		}, pglimit.ErrInvalidID},
	} {
		before := b.dump(t)
		err := c.call()
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if after := b.dump(t); after != before {
			t.Errorf("%s wrote:\n%s\nbefore:\n%s", c.name, after, before)
		}
	}
}

// The Config's bounds are checked by New.
func TestNewInvalidConfig(t *testing.T) {
	for _, cfg := range []*pglimitquota.Config{
		nil,
		{},
		{Namespace: "n", Allowance: -1},
		{Namespace: "n", Allowance: 5, HardCap: 4},
		{Namespace: "n", Period: 7},
		{Namespace: "n", TimeZone: "Mars/Olympus_Mons"},
		{Namespace: "n", Thresholds: []float64{0.8, 0}},
		{Namespace: "n", Thresholds: []float64{0.00005}},
		{Namespace: "n", Thresholds: []float64{11}},
		{Namespace: "n", IDRetention: time.Second},
		{Namespace: "n", Timeout: -1},
		{Namespace: "n", Schema: "a.b"},
	} {
		if _, err := pglimitquota.New(struct{ pglimit.DB }{}, cfg); !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// SetPlan at once keeps the period and its counters while the anchor and
// zone stay, and starts a period now when they change; at the next
// period, the plan takes over exactly at the current period's end.
func TestSetPlanWhen(t *testing.T) {
	b := setup(t, pglimitquota.Config{Allowance: 10}, time.Date(2027, 5, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	p := pglimitquota.Plan{Anchor: pglimitquota.Anchor{Day: 1}, Allowance: 10}
	if _, err := b.q.SetPlan(ctx, "k", p, pglimitquota.AtOnce); err != nil {
		t.Fatal(err)
	}
	b.clock.Set(time.Date(2027, 5, 10, 0, 0, 0, 0, time.UTC))
	allow(t, ctx, b.q, "k", 8)
	// Same anchor, more allowance, at once: the 8 used stay.
	p.Allowance = 20
	from, err := b.q.SetPlan(ctx, "k", p, pglimitquota.AtOnce)
	if err != nil {
		t.Fatal(err)
	}
	if !from.Equal(b.clock.Now()) {
		t.Fatalf("at once from %s, want now %s", from, b.clock.Now())
	}
	if d := allow(t, ctx, b.q, "k", 12); !d.Allowed || d.Usage.Used != 20 || d.Usage.Allowance != 20 {
		t.Fatalf("after raising the allowance: %+v", d)
	}
	// A new anchor from the next period: the current one ends on 1 June.
	p.Anchor.Day, p.Allowance = 15, 30
	from, err = b.q.SetPlan(ctx, "k", p, pglimitquota.AtNextPeriod)
	if err != nil {
		t.Fatal(err)
	}
	june := time.Date(2027, 6, 1, 0, 0, 0, 0, time.UTC)
	if !from.Equal(june) {
		t.Fatalf("next period from %s, want %s", from, june)
	}
	b.clock.Set(june.Add(-time.Microsecond))
	if u, _ := b.q.Usage(ctx, "k"); u.Allowance != 20 || u.Used != 20 {
		t.Fatalf("1µs before: %+v", u)
	}
	b.clock.Set(june)
	d := allow(t, ctx, b.q, "k", 30)
	if !d.Allowed || d.Usage.Allowance != 30 || !d.Usage.PeriodStart.Equal(june) || !d.Usage.PeriodEnd.Equal(time.Date(2027, 6, 15, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("the next plan: %+v", d)
	}
	// A new zone at once: a period starts now, with nothing used.
	b.clock.Set(time.Date(2027, 6, 20, 12, 0, 0, 0, time.UTC))
	p.TimeZone = "Europe/Paris"
	if _, err := b.q.SetPlan(ctx, "k", p, pglimitquota.AtOnce); err != nil {
		t.Fatal(err)
	}
	paris, _ := time.LoadLocation("Europe/Paris")
	u, err := b.q.Usage(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if u.Used != 0 || !u.PeriodStart.Equal(b.clock.Now()) || !u.PeriodEnd.Equal(time.Date(2027, 7, 15, 0, 0, 0, 0, paris)) {
		t.Fatalf("new zone: %+v", u)
	}
}

// Quotas of two namespaces in one schema share no key, id or event.
func TestNamespacesApart(t *testing.T) {
	b := setup(t, pglimitquota.Config{Namespace: "a", Allowance: 1, Thresholds: []float64{1}}, time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC))
	other, err := pglimitquota.New(b.pool, &pglimitquota.Config{Schema: b.schema, Namespace: "b", Allowance: 1, Thresholds: []float64{1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := pglimit.WithID(context.Background(), "same-id")
	for _, q := range []*pglimitquota.Quota{b.q, other} {
		if d := allow(t, ctx, q, "k", 1); !d.Allowed || d.Replayed {
			t.Fatalf("first in its namespace: %+v", d)
		}
	}
	if n := b.count(t, "pglimit_quota_events"); n != 2 {
		t.Fatalf("%d events, want one per namespace", n)
	}
	events, err := other.TakeEvents(context.Background(), b.pool, 10)
	if err != nil || len(events) != 1 {
		t.Fatalf("namespace b's events: %+v, %v", events, err)
	}
}

// A key anchored by its first admission keeps its period and counters
// when SetPlan at once names the same day and zone on a Monthly quota
// (whose anchor has no month).
func TestSetPlanSameAnchorAsFirstUse(t *testing.T) {
	b := setup(t, pglimitquota.Config{Allowance: 10}, time.Date(2027, 11, 10, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	allow(t, ctx, b.q, "k", 8)
	b.clock.Advance(time.Hour)
	if _, err := b.q.SetPlan(ctx, "k", pglimitquota.Plan{Anchor: pglimitquota.Anchor{Day: 10}, Allowance: 20}, pglimitquota.AtOnce); err != nil {
		t.Fatal(err)
	}
	u, err := b.q.Usage(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if u.Used != 8 || u.Allowance != 20 || !u.PeriodStart.Equal(time.Date(2027, 11, 10, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("after the same anchor at once: %+v, want 8 used of 20 since 10 November", u)
	}
}

// A midnight that a DST change skips starts the period at the local
// day's first instant; a midnight that happens twice, at its later
// occurrence (standard time): Havana's clocks go from 00:00 to 01:00 on
// 14 March 2027, and from 01:00 back to 00:00 on 7 November 2027.
func TestPeriodMidnightDST(t *testing.T) {
	b := setup(t, pglimitquota.Config{Allowance: 5}, time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	for _, c := range []struct {
		day        int
		at         time.Time
		start, end time.Time
	}{
		{14, time.Date(2027, 3, 20, 0, 0, 0, 0, time.UTC), time.Date(2027, 3, 14, 5, 0, 0, 0, time.UTC), time.Date(2027, 4, 14, 4, 0, 0, 0, time.UTC)},
		{7, time.Date(2027, 11, 10, 0, 0, 0, 0, time.UTC), time.Date(2027, 11, 7, 5, 0, 0, 0, time.UTC), time.Date(2027, 12, 7, 5, 0, 0, 0, time.UTC)},
	} {
		key := fmt.Sprint("havana-", c.day)
		b.clock.Set(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
		if _, err := b.q.SetPlan(ctx, key, pglimitquota.Plan{Anchor: pglimitquota.Anchor{Day: c.day}, TimeZone: "America/Havana", Allowance: 5}, pglimitquota.AtOnce); err != nil {
			t.Fatal(err)
		}
		b.clock.Set(c.at)
		u, err := b.q.Usage(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !u.PeriodStart.Equal(c.start) || !u.PeriodEnd.Equal(c.end) {
			t.Errorf("anchor %d: [%s, %s), want [%s, %s)", c.day, u.PeriodStart.UTC(), u.PeriodEnd.UTC(), c.start, c.end)
		}
	}
}

// SetPlan at once with another anchor starts a period with nothing used,
// even at the instant the period in force started: a key first admitted
// at T, and given another anchor at T, has used nothing (found by
// TestModelQuota).
func TestSetPlanNewAnchorSameInstant(t *testing.T) {
	start := time.Date(2027, 11, 10, 12, 0, 0, 0, time.UTC)
	b := setup(t, pglimitquota.Config{Allowance: 10}, start)
	ctx := context.Background()
	allow(t, ctx, b.q, "k", 8)
	if _, err := b.q.SetPlan(ctx, "k", pglimitquota.Plan{Anchor: pglimitquota.Anchor{Day: 31}, Allowance: 20}, pglimitquota.AtOnce); err != nil {
		t.Fatal(err)
	}
	u, err := b.q.Usage(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if u.Used != 0 || !u.PeriodStart.Equal(start) || !u.PeriodEnd.Equal(time.Date(2027, 11, 30, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("after another anchor at once, at the same instant: %+v, want nothing used from %s to 30 November", u, start)
	}
	if d := allow(t, ctx, b.q, "k", 20); !d.Allowed || d.FromAllowance != 20 {
		t.Fatalf("the new period's allowance: %+v, want 20 admitted", d)
	}
}

// A key's period, once a decision has written it, holds until its end:
// an instance whose Config names another default zone counts within it,
// on the same counters, and starts the next period at the new zone's
// midnight. (A period worked out again on every decision would move to
// the new zone's midnight at once, and start the counters afresh.)
func TestPeriodKeptUntilItsEnd(t *testing.T) {
	// A new key is anchored at its first decision, which its first period
	// starts at.
	start, end := time.Date(2027, 3, 10, 12, 0, 0, 0, time.UTC), time.Date(2027, 4, 10, 0, 0, 0, 0, time.UTC)
	b := setup(t, pglimitquota.Config{Allowance: 5, TimeZone: "UTC"}, start)
	ctx := context.Background()
	d := allow(t, ctx, b.q, "k", 2)
	if !d.Allowed || !d.Usage.PeriodStart.Equal(start) || !d.Usage.PeriodEnd.Equal(end) {
		t.Fatalf("first decision: %+v, want [%s, %s)", d, start, end)
	}
	tokyo, err := pglimitquota.New(b.pool, &pglimitquota.Config{Schema: b.schema, Namespace: "n", Allowance: 5, TimeZone: "Asia/Tokyo"})
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Set(end.Add(-time.Microsecond))
	d = allow(t, ctx, tokyo, "k", 3)
	if !d.Allowed || d.Usage.Used != 5 || !d.Usage.PeriodStart.Equal(start) || !d.Usage.PeriodEnd.Equal(end) {
		t.Fatalf("from an instance on Tokyo's zone, 1µs before the end: %+v; want 5 used in [%s, %s)", d, start, end)
	}
	b.clock.Set(end)
	d = allow(t, ctx, tokyo, "k", 1)
	jst := time.FixedZone("JST", 9*3600)
	next, after := time.Date(2027, 4, 10, 0, 0, 0, 0, jst), time.Date(2027, 5, 10, 0, 0, 0, 0, jst)
	if !d.Allowed || d.Usage.Used != 1 || !d.Usage.PeriodStart.Equal(next) || !d.Usage.PeriodEnd.Equal(after) {
		t.Fatalf("at the end: %+v; want 1 used in Tokyo's [%s, %s)", d, next, after)
	}
}
