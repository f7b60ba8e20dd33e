package pglimitquota_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

// keyRows returns, as text, key's rows of the quota's tables in schema:
// its row of pglimit_quota_keys, its ids' rows and its events' rows.
func keyRows(t *testing.T, db *pgxpool.Pool, schema, key string) (keys, ids, events string) {
	t.Helper()
	out := make([]string, 3)
	for i, table := range []string{"pglimit_quota_keys", "pglimit_quota_ids", "pglimit_quota_events"} {
		sql := "SELECT coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '') FROM " +
			pgx.Identifier{schema, table}.Sanitize() + " AS t WHERE t.key = $1"
		if err := db.QueryRow(context.Background(), sql, key).Scan(&out[i]); err != nil {
			t.Fatal(err)
		}
	}
	return out[0], out[1], out[2]
}

// Forget deletes the key's row (its plan, next plan, counters and
// credits) and its ids' rows, keeps its threshold events and every row
// of other keys; Usage then shows a fresh period anchored at that
// instant on the Config's plan, a second Forget, or one of a key never
// seen, is no error and writes nothing.
func TestForgetDeletesEverything(t *testing.T) {
	start := time.Date(2027, 3, 10, 12, 0, 0, 0, time.UTC)
	b := setup(t, pglimitquota.Config{Allowance: 10, Thresholds: []float64{0.5}}, start)
	ctx := context.Background()
	for _, key := range []string{"k", "other"} {
		if _, err := b.q.SetPlan(ctx, key, pglimitquota.Plan{Anchor: pglimitquota.Anchor{Day: 3}, Allowance: 100, HardCap: 200}, pglimitquota.AtOnce); err != nil {
			t.Fatal(err)
		}
		if _, err := b.q.SetPlan(ctx, key, pglimitquota.Plan{Anchor: pglimitquota.Anchor{Day: 5}, Allowance: 50}, pglimitquota.AtNextPeriod); err != nil {
			t.Fatal(err)
		}
		if err := b.q.Grant(ctx, key, 7, start.AddDate(0, 2, 0)); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if d := allow(t, pglimit.WithID(ctx, fmt.Sprint(key, "-id-", i)), b.q, key, 30); !d.Allowed {
				t.Fatalf("%s: %+v", key, d)
			}
		}
	}
	_, _, events := keyRows(t, b.admin, b.schema, "k")
	if events == "" {
		t.Fatal("the admissions crossed no threshold")
	}
	oKeys, oIDs, oEvents := keyRows(t, b.admin, b.schema, "other")

	b.clock.Advance(time.Hour)
	if err := b.q.Forget(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	keys, ids, eventsAfter := keyRows(t, b.admin, b.schema, "k")
	if keys != "" || ids != "" {
		t.Fatalf("after Forget the key has rows left:\nkeys:\n%s\nids:\n%s", keys, ids)
	}
	if eventsAfter != events {
		t.Fatalf("Forget changed the key's events:\n%s\nwant:\n%s", eventsAfter, events)
	}
	if k, i, e := keyRows(t, b.admin, b.schema, "other"); k != oKeys || i != oIDs || e != oEvents {
		t.Fatalf("Forget of k changed the rows of other:\n%s\n%s\n%s", k, i, e)
	}

	now := b.clock.Now()
	end := time.Date(now.Year(), now.Month()+1, now.Day(), 0, 0, 0, 0, time.UTC) // anchored on today, at midnight
	u, err := b.q.Usage(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if u.Used != 0 || u.CreditsLeft != 0 || u.Allowance != 10 || u.HardCap != 10 || !u.PeriodStart.Equal(now) || !u.PeriodEnd.Equal(end) {
		t.Fatalf("Usage after Forget: %+v; want a fresh period from %s on the Config's plan", u, now)
	}
	d := allow(t, ctx, b.q, "k", 4)
	if !d.Allowed || d.FromAllowance != 4 || d.FromCredits != 0 || d.Usage.Used != 4 || !d.Usage.PeriodStart.Equal(now) {
		t.Fatalf("the first decision after Forget: %+v; want 4 from a fresh allowance, from %s", d, now)
	}

	if err := b.q.Forget(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	before := b.dump(t)
	for _, key := range []string{"k", "never-seen"} {
		if err := b.q.Forget(ctx, key); err != nil {
			t.Fatalf("Forget of %s, which the quota has nothing of: %v, want nil", key, err)
		}
	}
	if after := b.dump(t); after != before {
		t.Fatalf("Forget of a key with nothing wrote:\nbefore\n%s\nafter\n%s", before, after)
	}
}

// After Forget, RefundID and SettleID of an id the key had are
// ErrNotAdmitted and write nothing: no row of the key comes back, not
// even from a SettleID above the estimate, which charges a key with no
// row as a decision would. A retry of Allow with the id decides afresh,
// on a fresh row.
func TestForgetIDs(t *testing.T) {
	b := setup(t, pglimitquota.Config{Allowance: 100}, time.Date(2027, 3, 10, 12, 0, 0, 0, time.UTC))
	ctx := context.Background()
	for i := range 3 {
		allow(t, pglimit.WithID(ctx, fmt.Sprint("id-", i)), b.q, "k", 10)
	}
	if err := b.q.Forget(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	before := b.dump(t)
	calls := []struct {
		what string
		call func() error
	}{
		{"RefundID", func() error { _, err := b.q.RefundID(ctx, "id-0", 5); return err }},
		{"SettleID below the estimate", func() error { _, err := b.q.SettleID(ctx, "id-1", 3); return err }},
		{"SettleID above the estimate", func() error { _, err := b.q.SettleID(ctx, "id-2", 25); return err }},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, pglimit.ErrNotAdmitted) {
			t.Errorf("%s of an id of a forgotten key: %v, want ErrNotAdmitted", c.what, err)
		}
	}
	if after := b.dump(t); after != before {
		t.Fatalf("refunds and settles of a forgotten key's ids wrote:\nbefore\n%s\nafter\n%s", before, after)
	}
	d := allow(t, pglimit.WithID(ctx, "id-0"), b.q, "k", 10)
	if !d.Allowed || d.Replayed || d.Usage.Used != 10 {
		t.Fatalf("a retry of a forgotten id: %+v; want it admitted afresh, 10 used", d)
	}
}

// An invalid key is ErrInvalidKey, as for Allow, and writes nothing.
func TestForgetBadInput(t *testing.T) {
	b := setup(t, pglimitquota.Config{Allowance: 5}, time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	allow(t, pglimit.WithID(ctx, "id"), b.q, "k", 2)
	before := b.dump(t)
	for _, c := range []struct{ what, key string }{
		{"empty", ""},
		{"too long", strings.Repeat("k", pglimit.MaxKeyLength+1)},
		{"not UTF-8", "k\xff"},
		{"NUL", "k\x00"},
	} {
		if err := b.q.Forget(ctx, c.key); !errors.Is(err, pglimit.ErrInvalidKey) {
			t.Errorf("%s key: %v, want ErrInvalidKey", c.what, err)
		}
		if _, err := b.q.Allow(ctx, c.key, 1); !errors.Is(err, pglimit.ErrInvalidKey) {
			t.Errorf("Allow, %s key: %v, want ErrInvalidKey as Forget", c.what, err)
		}
	}
	if after := b.dump(t); after != before {
		t.Fatalf("bad input wrote:\nbefore\n%s\nafter\n%s", before, after)
	}
}

// checkForgetConsistent checks the invariant a Forget racing decisions
// keeps, on the real database state of key: every id row has the key's
// row, and the key's counters are the sum of the costs its ids' rows
// hold (every decision of the test has an id, all in one period), so
// that no admission deleted by a Forget still counts, and none counted
// lost its id.
func checkForgetConsistent(t *testing.T, admin *pgxpool.Pool, schema, key string) (used int64, ids int) {
	t.Helper()
	var rows int
	var sum int64
	keysT, idsT := pgx.Identifier{schema, "pglimit_quota_keys"}.Sanitize(), pgx.Identifier{schema, "pglimit_quota_ids"}.Sanitize()
	err := admin.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM `+keysT+` WHERE namespace = 'n' AND key = $1),
		       coalesce((SELECT from_allowance + from_credits + overage FROM `+keysT+` WHERE namespace = 'n' AND key = $1), 0),
		       (SELECT count(*) FROM `+idsT+` WHERE namespace = 'n' AND key = $1),
		       (SELECT coalesce(sum(answer[1]), 0) FROM `+idsT+` WHERE namespace = 'n' AND key = $1)`, key).Scan(&rows, &used, &ids, &sum)
	if err != nil {
		t.Fatal(err)
	}
	if rows == 0 && ids > 0 {
		t.Errorf("%d ids of %s left without the key's row", ids, key)
	}
	if used != sum {
		t.Errorf("%s: the key's row counts %d units, its ids' rows hold %d: a Forget split an admission from its id", key, used, sum)
	}
	return used, ids
}

// Forget races Allow with ids of the same key from two instances, one
// through PgBouncer: after each round, and at the end, every id row has
// its key's row and the key's counters are exactly the units of the ids
// admitted since the last Forget took effect; a Forget that returned
// left nothing of what was admitted before it began.
func TestForgetConcurrent(t *testing.T) {
	schema := testdb.Schema(t)
	cfg := pglimitquota.Config{Schema: schema, Namespace: "n", Allowance: 1_000_000}
	admin := testdb.Pool(t)
	quotas := twoInstances(t, admin, cfg)
	ctx := context.Background()
	rounds, callers, calls := 8, 4, 8
	if testing.Short() {
		rounds = 4
	}
	var forgets, admitted atomic.Int64
	for r := range rounds {
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				q := quotas[c%2]
				for i := range calls {
					id := fmt.Sprintf("r%d-c%d-%d", r, c, i)
					d, err := q.Allow(pglimit.WithID(ctx, id), "k", int64(1+i%3))
					if err != nil || !d.Allowed {
						t.Errorf("Allow %s: %+v, %v", id, d, err)
						return
					}
					admitted.Add(1)
				}
			})
		}
		for f := range 2 {
			wg.Go(func() {
				q := quotas[f]
				for range calls / 2 {
					if err := q.Forget(ctx, "k"); err != nil {
						t.Errorf("Forget: %v", err)
						return
					}
					forgets.Add(1)
				}
			})
		}
		wg.Wait()
		checkForgetConsistent(t, admin, schema, "k")
		// A Forget after the round leaves nothing of it.
		if err := quotas[r%2].Forget(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if used, ids := checkForgetConsistent(t, admin, schema, "k"); used != 0 || ids != 0 {
			t.Fatalf("round %d: after a Forget that nothing raced, %d used and %d ids left", r, used, ids)
		}
	}
	t.Logf("%d admissions, %d Forgets racing them", admitted.Load(), forgets.Load())
}

// SettleID above the estimate and RefundID of a key's ids race a Forget
// of the key, from two instances, one through PgBouncer: each applies
// before the Forget, which then deletes it with the rest, or after, as
// ErrNotAdmitted, writing nothing; so nothing of the key is left, and
// no settle brought its row back.
func TestForgetRacesSettle(t *testing.T) {
	schema := testdb.Schema(t)
	cfg := pglimitquota.Config{Schema: schema, Namespace: "n", Allowance: 1000}
	admin := testdb.Pool(t)
	quotas := twoInstances(t, admin, cfg)
	ctx := context.Background()
	const rounds, ids = 6, 16
	var applied, notAdmitted atomic.Int64
	for r := range rounds {
		for i := range ids {
			allow(t, pglimit.WithID(ctx, fmt.Sprintf("r%d-%d", r, i)), quotas[i%2], "k", 5)
		}
		var wg sync.WaitGroup
		for i := range ids {
			wg.Go(func() {
				q, id := quotas[i%2], fmt.Sprintf("r%d-%d", r, i)
				var err error
				if i%2 == 0 {
					_, err = q.SettleID(ctx, id, 9)
				} else {
					_, err = q.RefundID(ctx, id, 2)
				}
				switch {
				case err == nil:
					applied.Add(1)
				case errors.Is(err, pglimit.ErrNotAdmitted):
					notAdmitted.Add(1)
				default:
					t.Errorf("%s: %v", id, err)
				}
			})
			if i == ids/2 {
				wg.Go(func() {
					if err := quotas[r%2].Forget(ctx, "k"); err != nil {
						t.Errorf("Forget: %v", err)
					}
				})
			}
		}
		wg.Wait()
		if used, n := checkForgetConsistent(t, admin, schema, "k"); used != 0 || n != 0 {
			t.Fatalf("round %d: after the Forget and the settles racing it, the key used %d with %d ids: a settle wrote after the Forget", r, used, n)
		}
	}
	t.Logf("%d refunds and settles applied before the Forget, %d were ErrNotAdmitted after it", applied.Load(), notAdmitted.Load())
}
