package pglimitquota_test

import (
	"context"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

// A credit counts while the database time is before its expiry, to the
// microsecond: an admission 1µs before it, a refusal at it and 1µs after.
func TestCreditExpiryExact(t *testing.T) {
	start := time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC)
	b := setup(t, pglimitquota.Config{}, start) // no allowance: credits only
	ctx := context.Background()
	expires := start.Add(36*time.Hour + 123456*time.Microsecond)
	if err := b.q.Grant(ctx, "k", 5, expires); err != nil {
		t.Fatal(err)
	}
	b.clock.Set(expires.Add(-time.Microsecond))
	d := allow(t, ctx, b.q, "k", 1)
	if !d.Allowed || d.FromCredits != 1 || d.Usage.CreditsLeft != 4 {
		t.Fatalf("1µs before the expiry: %+v", d)
	}
	for _, at := range []time.Time{expires, expires.Add(time.Microsecond)} {
		b.clock.Set(at)
		before := b.dump(t)
		if d := allow(t, ctx, b.q, "k", 1); d.Allowed || d.Usage.CreditsLeft != 0 {
			t.Fatalf("at %s (expiry %s): %+v", at, expires, d)
		}
		if after := b.dump(t); after != before {
			t.Fatalf("a refusal wrote:\n%s\nbefore:\n%s", after, before)
		}
	}
	// And the other way round: a credit granted after a refusal, expiring
	// 1µs after it, admits nothing later; one that expires later admits.
	refused := b.clock.Now()
	if err := b.q.Grant(ctx, "k", 1, refused.Add(time.Microsecond)); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Microsecond)
	if d := allow(t, ctx, b.q, "k", 1); d.Allowed {
		t.Fatalf("a credit expired 0µs ago admitted: %+v", d)
	}
}

// Credits are spent after the allowance and before overage, the
// earliest expiry first, whatever the period they were granted in, and
// reported apart.
func TestCreditOrder(t *testing.T) {
	start := time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC)
	b := setup(t, pglimitquota.Config{Allowance: 2, HardCap: 3}, start)
	ctx := context.Background()
	late, early := start.AddDate(0, 3, 0), start.AddDate(0, 0, 20)
	if err := b.q.Grant(ctx, "k", 5, late); err != nil {
		t.Fatal(err)
	}
	if err := b.q.Grant(ctx, "k", 2, early); err != nil {
		t.Fatal(err)
	}
	d := allow(t, ctx, b.q, "k", 5)
	if !d.Allowed || d.FromAllowance != 2 || d.FromCredits != 3 || d.Overage != 0 || d.Usage.CreditsLeft != 4 {
		t.Fatalf("allowance then credits: %+v", d)
	}
	// The early credit is gone: its expiry takes nothing away.
	b.clock.Set(early)
	u, err := b.q.Usage(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if u.CreditsLeft != 4 || u.Used != 5 || u.FromCredits != 3 {
		t.Fatalf("after the early credit's expiry: %+v", u)
	}
	// The next period: allowance, then the late credit, then overage.
	b.clock.Set(start.AddDate(0, 1, 0))
	d = allow(t, ctx, b.q, "k", 7)
	if !d.Allowed || d.FromAllowance != 2 || d.FromCredits != 4 || d.Overage != 1 || d.Usage.CreditsLeft != 0 {
		t.Fatalf("next period: %+v", d)
	}
	if d := allow(t, ctx, b.q, "k", 1); d.Allowed {
		t.Fatalf("past the hard cap: %+v", d)
	}
}

// A key holds at most MaxCredits live credits; an expired one makes room.
func TestCreditBound(t *testing.T) {
	start := time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC)
	b := setup(t, pglimitquota.Config{}, start)
	ctx := context.Background()
	for i := range pglimitquota.MaxCredits {
		if err := b.q.Grant(ctx, "k", 1, start.Add(time.Duration(i+1)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	before := b.dump(t)
	if err := b.q.Grant(ctx, "k", 1, start.Add(time.Hour)); err == nil {
		t.Fatal("a credit past MaxCredits was granted")
	}
	if after := b.dump(t); after != before {
		t.Fatal("a refused grant wrote")
	}
	b.clock.Set(start.Add(time.Hour))
	if err := b.q.Grant(ctx, "k", 1, start.Add(time.Hour+time.Microsecond)); err != nil {
		t.Fatal(err)
	}
	u, err := b.q.Usage(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if u.CreditsLeft != pglimitquota.MaxCredits {
		t.Fatalf("credits left %d, want %d", u.CreditsLeft, pglimitquota.MaxCredits)
	}
}
