package pglimitquota_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

// A retry storm: 8 callers on two instances (one through PgBouncer)
// retry each of 200 ids 5 times, in random order, over 4 keys whose
// hard caps refuse some. Each id is charged at most once, exactly one
// call of an admitted id is not a replay, every admission of an id
// reports the first one, and the database's counters add up to the
// admitted ids' costs.
func TestIDRetryStorm(t *testing.T) {
	schema := testdb.Schema(t)
	cfg := pglimitquota.Config{Schema: schema, Namespace: "n", Allowance: 60, HardCap: 80}
	admin := testdb.Pool(t)
	quotas := twoInstances(t, admin, cfg)
	const ids, retries, callers = 200, 5, 8
	type call struct{ id int }
	var calls []call
	for id := range ids {
		for range retries {
			calls = append(calls, call{id})
		}
	}
	rand.Shuffle(len(calls), func(i, j int) { calls[i], calls[j] = calls[j], calls[i] })
	key := func(id int) string { return fmt.Sprintf("k%d", id%4) }
	cost := func(id int) int64 { return int64(id%3 + 1) }
	var mu sync.Mutex
	seen := map[int][]pglimitquota.Decision{}
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := c; i < len(calls); i += callers {
				id := calls[i].id
				ctx := pglimit.WithID(context.Background(), fmt.Sprintf("id-%d", id))
				d, err := quotas[c%2].Allow(ctx, key(id), cost(id))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				seen[id] = append(seen[id], d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	var charged int64
	admitted := 0
	for id, ds := range seen {
		var first *pglimitquota.Decision
		fresh := 0
		for i, d := range ds {
			if !d.Allowed {
				continue
			}
			if !d.Replayed {
				fresh++
			}
			if first == nil {
				first = &ds[i]
			} else if d.FromAllowance != first.FromAllowance || d.Overage != first.Overage || d.Usage.Used != first.Usage.Used || d.Cost != first.Cost {
				t.Errorf("id %d: an admission %+v unlike the first %+v", id, d, *first)
			}
		}
		if first != nil {
			admitted++
			charged += cost(id)
		}
		if first != nil && fresh != 1 {
			t.Errorf("id %d: %d calls charged it", id, fresh)
		}
	}
	var rows int
	var used int64
	ctx := context.Background()
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "pglimit_quota_ids"}.Sanitize()).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if err := admin.QueryRow(ctx, "SELECT coalesce(sum(from_allowance + from_credits + overage), 0) FROM "+pgx.Identifier{schema, "pglimit_quota_keys"}.Sanitize()).Scan(&used); err != nil {
		t.Fatal(err)
	}
	if rows != admitted || used != charged {
		t.Fatalf("database: %d ids, %d units charged; callers saw %d admitted ids costing %d", rows, used, admitted, charged)
	}
	if admitted == ids || admitted == 0 {
		t.Fatalf("%d of %d ids admitted: the storm should meet the hard caps", admitted, ids)
	}
	t.Logf("%d of %d ids admitted, %d units", admitted, ids, charged)
}

// An id first refused is decided afresh; once admitted, a retry replays
// the admission even after the key's plan and period changed.
func TestIDRefusedThenAdmitted(t *testing.T) {
	start := time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC)
	b := setup(t, pglimitquota.Config{Allowance: 2}, start)
	ctx := pglimit.WithID(context.Background(), "job-7")
	if d := allow(t, context.Background(), b.q, "k", 2); !d.Allowed {
		t.Fatal(d)
	}
	if d := allow(t, ctx, b.q, "k", 1); d.Allowed || d.Replayed {
		t.Fatalf("over the allowance: %+v", d)
	}
	if n := b.count(t, "pglimit_quota_ids"); n != 0 {
		t.Fatalf("a refusal wrote %d ids", n)
	}
	b.clock.Set(start.AddDate(0, 1, 0))
	first := allow(t, ctx, b.q, "k", 1)
	if !first.Allowed || first.Replayed {
		t.Fatalf("in the next period: %+v", first)
	}
	b.clock.Advance(time.Hour)
	again := allow(t, ctx, b.q, "k", 1)
	if !again.Allowed || !again.Replayed || again.Usage != first.Usage {
		t.Fatalf("retry: %+v, want the first %+v", again, first)
	}
	if u, _ := b.q.Usage(context.Background(), "k"); u.Used != 1 {
		t.Fatalf("a retry charged: %+v", u)
	}
}

// An id admitted by AllowTx in a transaction that rolled back was never
// admitted: its retry is decided afresh and charged; one that committed
// is replayed.
func TestIDAllowTxRollback(t *testing.T) {
	b := setup(t, pglimitquota.Config{Allowance: 10, Thresholds: []float64{0.5}}, time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC))
	ctx := pglimit.WithID(context.Background(), "req-1")
	tx := begin(t, b.pool)
	d, err := b.q.AllowTx(ctx, tx, "k", 6)
	if err != nil || !d.Allowed || d.Replayed {
		t.Fatalf("in tx: %+v, %v", d, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.dump(t); got != "" {
		t.Fatalf("a rolled back admission left:\n%s", got)
	}
	tx = begin(t, b.pool)
	first, err := b.q.AllowTx(ctx, tx, "k", 6)
	if err != nil || !first.Allowed || first.Replayed {
		t.Fatalf("after the rollback: %+v, %v", first, err)
	}
	// Within the same transaction, a retry already replays.
	if d, err := b.q.AllowTx(ctx, tx, "k", 6); err != nil || !d.Replayed {
		t.Fatalf("retry in tx: %+v, %v", d, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if d := allow(t, ctx, b.q, "k", 6); !d.Replayed || d.Usage.Used != 6 {
		t.Fatalf("retry after commit: %+v", d)
	}
	if n := b.count(t, "pglimit_quota_events"); n != 1 {
		t.Fatalf("%d events, want 1", n)
	}
}

// The Cleaner deletes ids past their retention when its Tables list
// pglimit_quota_ids; an id deleted is decided afresh.
func TestCleanerDeletesQuotaIDs(t *testing.T) {
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	q, err := pglimitquota.New(pool, &pglimitquota.Config{Schema: schema, Namespace: "n", Allowance: 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, id := range []string{"old", "kept"} {
		allow(t, pglimit.WithID(ctx, id), q, "k", 1)
	}
	ids := pgx.Identifier{schema, "pglimit_quota_ids"}.Sanitize()
	// As if old's retention had passed.
	if _, err := pool.Exec(ctx, "UPDATE "+ids+" SET expires_at = now() - interval '1 second' WHERE id = 'old'"); err != nil {
		t.Fatal(err)
	}
	cl, err := pglimitclean.New(pool, &pglimitclean.Config{Schema: schema, Tables: []string{"pglimit_quota_ids"}, Interval: 50 * time.Millisecond, Retention: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cl.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()
	count := func(id string) int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+ids+" WHERE id = $1", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// A generous bound for a loaded machine: the Cleaner runs every 50 ms.
	for deadline := time.Now().Add(30 * time.Second); count("old") != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the expired id was not deleted within 30s")
		}
	}
	if count("kept") != 1 {
		t.Fatal("the id within its retention was deleted")
	}
	if d := allow(t, pglimit.WithID(ctx, "old"), q, "k", 1); d.Replayed {
		t.Fatalf("old after its deletion: %+v, want decided afresh", d)
	}
}
