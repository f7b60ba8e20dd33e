package pglimitquota_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

// An unknown outcome: a backend terminated while its commit waits (on a
// synchronous standby that never answers) has committed locally, yet
// its caller gets an error. Retrying each failed id leaves every id
// charged once or not at all, never twice: the key's counters equal the
// ids stored, and every retry of an id that committed replays it.
func TestIDUnknownOutcomeChargedOnce(t *testing.T) {
	testdb.Slow(t)
	ctx := t.Context()
	srv := testdb.OwnServer(t)
	admin := testdb.ServerPool(t, srv, 2)
	pool := testdb.ServerPool(t, srv, 16)
	if err := pglimit.Migrate(ctx, admin, "public"); err != nil {
		t.Fatal(err)
	}
	const ids = 64
	q, err := pglimitquota.New(pool, &pglimitquota.Config{Namespace: "n", Allowance: 20, HardCap: 1000})
	if err != nil {
		t.Fatal(err)
	}
	// The key's row exists before the storm, so that every id waits on it.
	if _, err := q.Allow(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	stop := testdb.SyncRepFault(t, admin)
	var (
		mu     sync.Mutex
		failed []string
		wg     sync.WaitGroup
	)
	for i := range ids {
		id := fmt.Sprint("id-", i)
		wg.Go(func() {
			if _, err := q.Allow(pglimit.WithID(ctx, id), "k", 1); err != nil {
				mu.Lock()
				failed = append(failed, id)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	terminated := stop()
	if terminated == 0 {
		t.Fatal("no backend was terminated while its commit waited: the test proves nothing")
	}
	replayed := 0
	for _, id := range failed {
		d, err := q.Allow(pglimit.WithID(ctx, id), "k", 1)
		if err != nil {
			t.Fatalf("retry of %s: %v", id, err)
		}
		if !d.Allowed {
			t.Fatalf("retry of %s refused: %+v", id, d)
		}
		if d.Replayed {
			replayed++
		}
	}
	var stored int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM public.pglimit_quota_ids WHERE namespace = 'n'").Scan(&stored); err != nil {
		t.Fatal(err)
	}
	var charged int64
	if err := admin.QueryRow(ctx, "SELECT from_allowance + from_credits + overage - 1 FROM public.pglimit_quota_keys WHERE namespace = 'n' AND key = 'k'").Scan(&charged); err != nil {
		t.Fatal(err)
	}
	u, err := q.Usage(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d backends terminated at their commit; %d callers failed, %d of their retries replayed a committed admission; %d charged, %d ids stored", terminated, len(failed), replayed, charged, stored)
	if charged != int64(stored) || stored != ids || u.Used != charged+1 {
		t.Errorf("%d units charged (Usage.Used %d, less 1) for %d ids stored (%d ids): an id was charged twice or lost", charged, u.Used, stored, ids)
	}
	if replayed == 0 {
		t.Log("no failed call had committed: the unknown outcome was not met this time")
	}
}
