package pglimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// withStrategy returns a constructor for pglimittest.Exercise that builds
// strategy s, with edit applied to the config.
func withStrategy(s pglimit.Strategy, edit func(*pglimit.Config)) pglimittest.NewLimiter {
	return func(db pglimit.DB, cfg *pglimit.Config) (pglimit.Limiter, error) {
		c := *cfg
		c.Strategy = s
		if edit != nil {
			edit(&c)
		}
		return pglimit.New(db, &c)
	}
}

func TestUpsert(t *testing.T) {
	t.Parallel()
	pglimittest.Exercise(t, withStrategy(pglimit.Upsert, nil))
}

func TestNoWait(t *testing.T) {
	t.Parallel()
	pglimittest.Exercise(t, withStrategy(pglimit.NoWait, nil))
}

func TestRange(t *testing.T) {
	t.Parallel()
	pglimittest.Exercise(t, withStrategy(pglimit.Range, nil))
}

// PlainInsert is the article's form, kept for the load test. It does not
// pass the suite: racing plain INSERTs on one key can deadlock (40P01), and
// the deadlock victim may be the request that would have been admitted.
// Without contention it decides like Range.
func TestRangePlainInsertSequential(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lim, err := pglimit.New(pglimittest.Pool(t), &pglimit.Config{
		Strategy: pglimit.Range, PlainInsert: true, Schema: pglimittest.Schema(t), Cooldown: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false} {
		d, err := lim.Allow(ctx, "k")
		if err != nil || d.Allowed != want {
			t.Fatalf("request %d: %+v, %v; want Allowed=%t", i, d, err, want)
		}
		if !d.Allowed && (d.RetryAfter <= 0 || d.RetryAfter > time.Minute) {
			t.Fatalf("request %d: RetryAfter %s, want in (0, 1m]", i, d.RetryAfter)
		}
	}
}
