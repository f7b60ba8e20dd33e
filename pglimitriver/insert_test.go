package pglimitriver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// enqueueExport inserts an export of customer in tx if the customer's
// quota admits it: the job and its charge commit or roll back together.
func enqueueExport(ctx context.Context, tx pgx.Tx, quota pglimit.Limiter, client *river.Client[pgx.Tx], customer string) (bool, error) {
	d, err := quota.AllowTx(ctx, tx, "export/"+customer)
	if err != nil || !d.Allowed {
		return false, err
	}
	if _, err := client.InsertTx(ctx, tx, exportArgs{Customer: customer}, nil); err != nil {
		return false, err
	}
	return true, nil
}

// Limiting the insertion of jobs, in the caller's transaction: a rolled
// back transaction leaves neither the job nor its charge, a committed one
// both, and past the quota no job is inserted.
func TestInsertWithAllowTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := riverSchema(t, pool)
	cfg := pglimit.Config{Schema: schema, Namespace: "enqueue",
		Limits: []pglimit.Limit{{Name: "daily", Rate: 2, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow}}}
	quota, err := pglimit.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &exportWorker{work: func(context.Context, *river.Job[exportArgs]) error { return nil }})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: schema, Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	inTx := func(commit bool) bool {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // after a commit, a no-op
		ok, err := enqueueExport(ctx, tx, quota, client, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return ok
	}
	state := func() (jobs, used int) {
		t.Helper()
		if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s", pgx.Identifier{schema, "river_job"}.Sanitize())).Scan(&jobs); err != nil {
			t.Fatal(err)
		}
		st, err := pglimit.Inspect(ctx, quota, "export/acme")
		if err != nil {
			t.Fatal(err)
		}
		return jobs, 2 - st.Limits[0].Remaining
	}
	if !inTx(false) {
		t.Fatal("the first export, rolled back, was refused")
	}
	if jobs, used := state(); jobs != 0 || used != 0 {
		t.Fatalf("after a rollback: %d jobs, %d of the quota used; want neither", jobs, used)
	}
	for i := range 2 {
		if !inTx(true) {
			t.Fatalf("export %d within the quota, committed, was refused", i+1)
		}
	}
	if inTx(true) {
		t.Fatal("a third export past the quota of 2 was inserted")
	}
	if jobs, used := state(); jobs != 2 || used != 2 {
		t.Fatalf("after two commits and a refusal: %d jobs, %d of the quota used; want 2 and 2", jobs, used)
	}
}
