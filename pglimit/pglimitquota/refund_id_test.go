package pglimitquota_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

// A refund by id gives the units back in reverse of how they were taken:
// off the overage, then to the credits (the last taken first, each to
// its own expiry), then to the allowance; a second refund or a settle of
// the id gives back nothing and writes nothing.
func TestRefundIDReverseOrder(t *testing.T) {
	start := time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC)
	b := setup(t, pglimitquota.Config{Allowance: 10, HardCap: 20}, start)
	ctx := context.Background()
	e1, e2 := start.AddDate(0, 0, 10), start.AddDate(0, 0, 20)
	for _, c := range []struct {
		units   int64
		expires time.Time
	}{{3, e1}, {4, e2}} {
		if err := b.q.Grant(ctx, "k", c.units, c.expires); err != nil {
			t.Fatal(err)
		}
	}
	d := allow(t, pglimit.WithID(ctx, "a"), b.q, "k", 20)
	if !d.Allowed || d.FromAllowance != 10 || d.FromCredits != 7 || d.Overage != 3 {
		t.Fatalf("admission: %+v", d)
	}
	r, err := b.q.RefundID(ctx, "a", 8)
	if err != nil {
		t.Fatal(err)
	}
	u := r.Usage
	if r.Units != 8 || r.Overage != 3 || r.FromCredits != 5 || r.FromAllowance != 0 || r.Kept != 0 ||
		u.FromAllowance != 10 || u.FromCredits != 2 || u.Overage != 0 || u.Used != 12 || u.CreditsLeft != 5 {
		t.Fatalf("refund of 8: %+v", r)
	}
	if got, err := b.q.Usage(ctx, "k"); err != nil || got.Used != 12 || got.CreditsLeft != 5 {
		t.Fatalf("Usage after the refund: %+v, %v", got, err)
	}
	before := b.dump(t)
	if _, err := b.q.RefundID(ctx, "a", 1); !errors.Is(err, pglimit.ErrAlreadySettled) {
		t.Fatalf("second refund: %v, want ErrAlreadySettled", err)
	}
	if _, err := b.q.SettleID(ctx, "a", 1); !errors.Is(err, pglimit.ErrAlreadySettled) {
		t.Fatalf("settle after the refund: %v, want ErrAlreadySettled", err)
	}
	if after := b.dump(t); after != before {
		t.Fatalf("a refused second refund wrote:\nbefore\n%s\nafter\n%s", before, after)
	}
	// The 5 credit units went back as they were taken: 4 to the credit
	// expiring at e2 (taken last), 1 to the one at e1.
	b.clock.Set(e1)
	if got, err := b.q.Usage(ctx, "k"); err != nil || got.CreditsLeft != 4 {
		t.Fatalf("Usage at e1: %+v, %v; want the 4 units of e2 left", got, err)
	}
	// A retry of the id still replays the first admission, for free.
	if d := allow(t, pglimit.WithID(ctx, "a"), b.q, "k", 20); !d.Replayed || d.Overage != 3 {
		t.Fatalf("retry after the refund: %+v", d)
	}
}

// Refunds and settles of the same ids race from two instances, one
// through PgBouncer: each id applies exactly once, every other call is
// ErrAlreadySettled, and the key's counters add up.
func TestRefundIDOnce(t *testing.T) {
	schema := testdb.Schema(t)
	cfg := pglimitquota.Config{Schema: schema, Namespace: "n", Allowance: 1000}
	admin := testdb.Pool(t)
	quotas := twoInstances(t, admin, cfg)
	ctx := context.Background()
	// Each instance alone refunds an admission that took credits, which
	// it did not make: the parameters it sends match the id's row.
	for i, q := range quotas {
		key := fmt.Sprint("solo-", i)
		if _, err := q.SetPlan(ctx, key, pglimitquota.Plan{Anchor: pglimitquota.Anchor{Day: 1}}, pglimitquota.AtOnce); err != nil {
			t.Fatal(err)
		}
		if err := q.Grant(ctx, key, 10, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		allow(t, pglimit.WithID(ctx, key), quotas[1-i], key, 4)
		if r, err := q.RefundID(ctx, key, 4); err != nil || r.FromCredits != 4 || r.Usage.Used != 0 || r.Usage.CreditsLeft != 10 {
			t.Fatalf("instance %d: %+v, %v", i, r, err)
		}
	}
	// 10 ids of 10 units to refund (RefundID of 3, or SettleID at 7: both
	// give back 3), 10 to settle (at 4 or at 13).
	const ids, callers = 20, 8
	for i := range ids {
		allow(t, pglimit.WithID(ctx, fmt.Sprint("id-", i)), quotas[i%2], "k", 10)
	}
	applied := make([]int, ids)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range ids {
		id := fmt.Sprint("id-", i)
		for c := range callers {
			wg.Go(func() {
				q := quotas[c%2]
				var err error
				switch {
				case i < 10 && c%3 == 0:
					_, err = q.SettleID(ctx, id, 7)
				case i < 10:
					_, err = q.RefundID(ctx, id, 3)
				case i%2 == 0:
					_, err = q.SettleID(ctx, id, 4)
				default:
					_, err = q.SettleID(ctx, id, 13)
				}
				switch {
				case err == nil:
					mu.Lock()
					applied[i]++
					mu.Unlock()
				case !errors.Is(err, pglimit.ErrAlreadySettled):
					t.Errorf("%s: %v", id, err)
				}
			})
		}
	}
	wg.Wait()
	for i, n := range applied {
		if n != 1 {
			t.Errorf("id-%d applied %d times", i, n)
		}
	}
	// 10 ids of 10 - 3, 5 settled at 4 and 5 at 13.
	want := int64(10*7 + 5*4 + 5*13)
	if u, err := quotas[0].Usage(ctx, "k"); err != nil || u.Used != want || u.FromAllowance != want {
		t.Fatalf("Usage: %+v, %v; want %d used", u, err, want)
	}
	var undone int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "pglimit_quota_ids"}.Sanitize()+" WHERE done IS NULL").Scan(&undone); err != nil {
		t.Fatal(err)
	}
	if undone != 0 {
		t.Fatalf("%d ids not marked done", undone)
	}
}

// Bad input, an unknown id, a refused one and one of an AllowTx not
// committed are typed errors that write nothing.
func TestRefundIDBadInput(t *testing.T) {
	b := setup(t, pglimitquota.Config{Allowance: 5}, time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	allow(t, pglimit.WithID(ctx, "ok"), b.q, "k", 5)
	if d := allow(t, pglimit.WithID(ctx, "no"), b.q, "k", 1); d.Allowed {
		t.Fatalf("over the allowance: %+v", d)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := b.q.AllowTx(pglimit.WithID(ctx, "tx"), tx, "other", 1); err != nil {
		t.Fatal(err)
	}
	before := b.dump(t)
	refund := func(id string, n int64) func() error {
		return func() error { _, err := b.q.RefundID(ctx, id, n); return err }
	}
	settle := func(id string, cost int64) func() error {
		return func() error { _, err := b.q.SettleID(ctx, id, cost); return err }
	}
	for _, c := range []struct {
		what string
		call func() error
		want error
	}{
		{"empty id", refund("", 1), pglimit.ErrInvalidID},
		{"id too long", refund(strings.Repeat("x", pglimit.MaxIDLength+1), 1), pglimit.ErrInvalidID},
		{"id with NUL", refund("o\x00k", 1), pglimit.ErrInvalidID},
		{"n 0", refund("ok", 0), pglimit.ErrInvalidCost},
		{"n negative", refund("ok", -1), pglimit.ErrInvalidCost},
		{"n more than it took", refund("ok", 6), pglimit.ErrInvalidCost},
		{"unknown id", refund("unknown", 1), pglimit.ErrNotAdmitted},
		{"refused id", refund("no", 1), pglimit.ErrNotAdmitted},
		{"id of an open AllowTx", refund("tx", 1), pglimit.ErrNotAdmitted},
		{"settle: empty id", settle("", 1), pglimit.ErrInvalidID},
		{"settle: cost negative", settle("ok", -1), pglimit.ErrInvalidCost},
		{"settle: cost past MaxUnits", settle("ok", pglimitquota.MaxUnits+1), pglimit.ErrInvalidCost},
		{"settle: unknown id", settle("unknown", 1), pglimit.ErrNotAdmitted},
		{"settle: refused id", settle("no", 1), pglimit.ErrNotAdmitted},
		{"settle: id of an open AllowTx", settle("tx", 1), pglimit.ErrNotAdmitted},
	} {
		if err := c.call(); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		}
	}
	if after := b.dump(t); after != before {
		t.Fatalf("bad input wrote:\nbefore\n%s\nafter\n%s", before, after)
	}
	// Once the caller's transaction commits, its id is refunded.
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := b.q.RefundID(ctx, "tx", 1); err != nil || r.FromAllowance != 1 || r.Usage.Used != 0 {
		t.Fatalf("refund after the commit: %+v, %v", r, err)
	}
}

// After the period rolls over, a refund gives back nothing of the
// closed period's allowance and overage, and the credit units to their
// credits while they live; a settle's excess is charged to the period of
// the settle. Within a period, a credit that expired takes nothing back.
func TestRefundIDPeriodRollover(t *testing.T) {
	start := time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC)
	b := setup(t, pglimitquota.Config{Allowance: 10, HardCap: 15}, start)
	ctx := context.Background()
	if err := b.q.Grant(ctx, "k", 10, time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	if d := allow(t, pglimit.WithID(ctx, "x"), b.q, "k", 22); d.FromAllowance != 10 || d.FromCredits != 10 || d.Overage != 2 {
		t.Fatalf("x: %+v", d)
	}
	if d := allow(t, pglimit.WithID(ctx, "y"), b.q, "k", 3); d.Overage != 3 {
		t.Fatalf("y: %+v", d)
	}
	b.clock.Set(start.AddDate(0, 1, 0)) // 5 February: the next period
	allow(t, ctx, b.q, "k", 4)
	r, err := b.q.RefundID(ctx, "x", 22)
	if err != nil {
		t.Fatal(err)
	}
	if r.FromAllowance != 0 || r.Overage != 0 || r.FromCredits != 10 || r.Kept != 12 ||
		r.Usage.FromAllowance != 4 || r.Usage.Used != 4 || r.Usage.CreditsLeft != 10 || !r.Usage.PeriodStart.Equal(start.AddDate(0, 1, 0)) {
		t.Fatalf("refund of x in the next period: %+v", r)
	}
	s, err := b.q.SettleID(ctx, "y", 8)
	if err != nil {
		t.Fatal(err)
	}
	if s.Estimate != 3 || s.FromAllowance != 5 || s.FromCredits != 0 || s.Forgiven != 0 || s.Usage.FromAllowance != 9 {
		t.Fatalf("settle of y at 8 in the next period: %+v", s)
	}
	// Within the period: z takes 1 from the allowance and 3 from a credit
	// that then expires.
	if err := b.q.Grant(ctx, "k", 3, time.Date(2027, 2, 6, 0, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	// The credit of 1 March expires later: z takes from the one of 6
	// February first.
	if d := allow(t, pglimit.WithID(ctx, "z"), b.q, "k", 4); d.FromAllowance != 1 || d.FromCredits != 3 {
		t.Fatalf("z: %+v", d)
	}
	b.clock.Set(time.Date(2027, 2, 6, 0, 0, 0, 0, time.UTC))
	r, err = b.q.RefundID(ctx, "z", 4)
	if err != nil {
		t.Fatal(err)
	}
	if r.FromAllowance != 1 || r.FromCredits != 0 || r.Kept != 3 || r.Usage.FromAllowance != 9 || r.Usage.FromCredits != 3 || r.Usage.CreditsLeft != 10 {
		t.Fatalf("refund of z after its credit expired: %+v", r)
	}
}

// Credit units go back to a live credit of their expiry, else to a credit
// of their own while the key holds fewer than MaxCredits live credits;
// past that they stay charged.
func TestRefundIDCredits(t *testing.T) {
	start := time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC)
	b := setup(t, pglimitquota.Config{}, start)
	ctx := context.Background()
	far := start.AddDate(0, 0, 20)
	grant := func(key string, units int64, expires time.Time) {
		t.Helper()
		if err := b.q.Grant(ctx, key, units, expires); err != nil {
			t.Fatal(err)
		}
	}
	// Two credits of one expiry: 7 units taken (5 and 2) go back to the
	// one left, which holds 10 after.
	grant("merge", 5, far)
	grant("merge", 5, far)
	allow(t, pglimit.WithID(ctx, "m"), b.q, "merge", 7)
	if r, err := b.q.RefundID(ctx, "m", 7); err != nil || r.FromCredits != 7 || r.Usage.CreditsLeft != 10 {
		t.Fatalf("merge: %+v, %v", r, err)
	}
	var n int
	sql := "SELECT cardinality(credit_units) FROM " + pgx.Identifier{b.schema, "pglimit_quota_keys"}.Sanitize() + " WHERE key = 'merge'"
	if err := b.admin.QueryRow(ctx, sql).Scan(&n); err != nil || n != 1 {
		t.Fatalf("merge holds %d credits (%v), want 1", n, err)
	}
	// A spent credit, then 63 or 64 others: room for it, or none.
	for key, others := range map[string]int{"room": pglimitquota.MaxCredits - 1, "full": pglimitquota.MaxCredits} {
		grant(key, 5, far)
		allow(t, pglimit.WithID(ctx, key), b.q, key, 5)
		for i := range others {
			grant(key, 1, far.Add(time.Duration(i+1)*time.Minute))
		}
		r, err := b.q.RefundID(ctx, key, 5)
		if err != nil {
			t.Fatal(err)
		}
		want := pglimitquota.Refund{Units: 5, FromCredits: 5}
		if key == "full" {
			want = pglimitquota.Refund{Units: 5, Kept: 5}
		}
		r.Usage = pglimitquota.Usage{}
		if r != want {
			t.Errorf("%s: %+v, want %+v", key, r, want)
		}
	}
}
