package pglimitquota_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

// 32 concurrent callers cross 80% and 100% of the allowance together:
// exactly one event row each, in the period's own key.
func TestThresholdsConcurrent(t *testing.T) {
	start := time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC)
	b := setup(t, pglimitquota.Config{Allowance: 100, HardCap: 200, Thresholds: []float64{0.8, 1, 1.5}}, start)
	ctx := context.Background()
	allow(t, ctx, b.q, "k", 79)
	if n := b.count(t, "pglimit_quota_events"); n != 0 {
		t.Fatalf("%d events below 80%%", n)
	}
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			if _, err := b.q.Allow(ctx, "k", 1); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	events, err := b.q.TakeEvents(ctx, tx, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 2 || events[0].Threshold != 0.8 || events[1].Threshold != 1 {
		t.Fatalf("events %+v, want 0.8 and 1", events)
	}
	for _, e := range events {
		want := int64(e.Threshold * 100)
		if e.Key != "k" || e.Used != want || e.Allowance != 100 || !e.PeriodStart.Equal(start) || !e.PeriodEnd.Equal(start.AddDate(0, 1, 0)) {
			t.Errorf("event %+v", e)
		}
	}
	// One decision that crosses 150% in the same period writes it; one
	// that crosses 80% again in the next period writes the next period's.
	allow(t, ctx, b.q, "k", 40)
	b.clock.Set(start.AddDate(0, 1, 0))
	allow(t, ctx, b.q, "k", 85)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "pglimit_quota_events"); n != 2 {
		t.Fatalf("%d events left, want 2 (150%% and next period's 80%%)", n)
	}
}

// TakeEvents in a transaction that rolls back gives the events back; a
// concurrent consumer skips those another holds.
func TestTakeEvents(t *testing.T) {
	b := setup(t, pglimitquota.Config{Allowance: 10, Thresholds: []float64{0.5, 1}}, time.Date(2027, 1, 5, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	for _, key := range []string{"a", "b"} {
		allow(t, ctx, b.q, key, 10) // both thresholds at once
	}
	first := begin(t, b.pool)
	got, err := b.q.TakeEvents(ctx, first, 3)
	if err != nil || len(got) != 3 {
		t.Fatalf("first consumer: %v, %+v", err, got)
	}
	second := begin(t, b.pool)
	rest, err := b.q.TakeEvents(ctx, second, 10)
	if err != nil || len(rest) != 1 {
		t.Fatalf("second consumer: %v, %+v", err, rest)
	}
	if err := second.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "pglimit_quota_events"); n != 3 {
		t.Fatalf("%d events after a rollback, want 3", n)
	}
	if _, err := b.q.TakeEvents(ctx, b.pool, 0); err == nil {
		t.Fatal("a limit of 0 was taken")
	}
}
