package pglimitriver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithealth"
	"github.com/pglimit/cooldown/pglimitriver"
)

// The middleware spends a health throttle's rate unchanged: the limiter
// alone would admit 1000 jobs a second, the throttle holds the key at 1 a
// second, so of three jobs the 2nd and 3rd, due 1 and 2 s on, are
// reserved and snoozed (within MaxReserve, 5 s), and start 2 s apart.
func TestHealthThrottle(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	schema := riverSchema(t, pool)
	cfg := &pglimit.Config{Schema: schema, Namespace: "exports", Overrides: true,
		Limits: []pglimit.Limit{{Name: "jobs", Rate: 1000, Period: time.Second, Burst: 1}}}
	lim, err := pglimit.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sampled := make(chan pglimithealth.State, 1)
	th, err := pglimithealth.New(pool, &pglimithealth.Config{
		Name: "exports", Limiter: cfg, Key: "export/acme",
		Signals: []pglimithealth.Signal{{Kind: pglimithealth.LockWaiters, Threshold: 1000}},
		Floor:   1, Ceiling: 1, Increase: 1, Decrease: 0.5, Period: 50 * time.Millisecond,
		OnSample: func(s pglimithealth.State) {
			select {
			case sampled <- s:
			default:
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := th.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = th.Stop(context.Background()) })
	select {
	case <-sampled:
	case <-time.After(time.Minute):
		t.Fatal("no sample within a minute")
	}
	mw, err := pglimitriver.NewMiddleware(&pglimitriver.Config{Limiter: lim, Key: customerKey})
	if err != nil {
		t.Fatal(err)
	}
	starts := make(chan time.Time, 3)
	clients := startWorkers(t, []*pgxpool.Pool{pool}, schema, mw, func(context.Context, *river.Job[exportArgs]) error {
		starts <- time.Now()
		return nil
	})
	insert(t, clients[0], "acme", 3)
	jobs := waitJobs(t, pool, schema, 3)
	close(starts)
	var at []time.Time
	for s := range starts {
		at = append(at, s)
	}
	snoozed := 0
	for _, j := range jobs {
		snoozed += j.snoozes
	}
	// At the limiter's own 1000 a second the three would start within
	// 2 ms, none snoozed; at the throttle's 1 a second they are 1 s apart.
	if len(at) != 3 || snoozed < 2 || at[2].Sub(at[0]) < 1900*time.Millisecond {
		t.Errorf("three jobs under a throttle of 1 a second: started at %v, %d snoozes; want 2 s apart at least, 2 snoozed", at, snoozed)
	}
	var rate int
	if err := pool.QueryRow(t.Context(), fmt.Sprintf("SELECT (limits->'jobs'->>'rate')::int FROM %s WHERE key = 'export/acme'",
		pgx.Identifier{schema, "pglimit_overrides"}.Sanitize())).Scan(&rate); err != nil || rate != 1 {
		t.Errorf("the key's own rate: %d, %v; want the throttle's 1", rate, err)
	}
}
