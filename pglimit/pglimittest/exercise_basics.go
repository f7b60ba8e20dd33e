package pglimittest

import (
	"context"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// exerciseBasics: a cooldown admits, then refuses until it ends, to the
// database's microsecond; keys and namespaces are independent; Reset
// lifts a cooldown; a caller's transaction decides what it commits.
func (s *suite) exerciseBasics(t *testing.T) {
	setup := s.setup
	ctx := context.Background()
	newLimiter := s.newLimiter

	t.Run("AdmitsThenRefuses", func(t *testing.T) {
		const cooldown = time.Minute
		lim, _ := setup(t, cooldown)
		d := mustAllow(t, lim, "alice")
		if !d.Allowed || d.RetryAfter != 0 || d.ResetAfter <= 0 || d.ResetAfter > cooldown {
			t.Fatalf("first request: got %+v, want admitted with ResetAfter in (0, %s]", d, cooldown)
		}
		d = mustAllow(t, lim, "alice")
		if d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > cooldown || d.ResetAfter != d.RetryAfter {
			t.Fatalf("second request: got %+v, want refused with RetryAfter in (0, %s]", d, cooldown)
		}
	})

	t.Run("CooldownBoundary", func(t *testing.T) {
		// Judged without trusting any clock but the database's: an
		// admission at database time t2 after one at t1 needs t2-t1 >= C,
		// and sent1 <= t1, t2 <= received2, so received2-sent1 >= C. A
		// refusal at tk needs tk < t1+C, so sentk-received1 < C.
		const cooldown = time.Second
		lim, _ := setup(t, cooldown)
		sent1 := time.Now()
		if d := mustAllow(t, lim, "k"); !d.Allowed {
			t.Fatalf("first request refused: %+v", d)
		}
		received1 := time.Now()
		var lastRefusalSent time.Duration
		for {
			sent := time.Now()
			d := mustAllow(t, lim, "k")
			received := time.Now()
			if d.Allowed {
				if got := received.Sub(sent1); got < cooldown {
					t.Fatalf("admitted again %s after the first admission was sent; cooldown is %s", got, cooldown)
				}
				break
			}
			if d.RetryAfter <= 0 || d.RetryAfter > cooldown {
				t.Fatalf("refusal RetryAfter %s, want in (0, %s]", d.RetryAfter, cooldown)
			}
			if got := sent.Sub(received1); got >= cooldown {
				t.Fatalf("refused a request sent %s after the admission returned; cooldown is %s", got, cooldown)
			}
			lastRefusalSent = sent.Sub(sent1)
			time.Sleep(2 * time.Millisecond)
		}
		if lastRefusalSent < cooldown/2 {
			t.Fatalf("last refusal came %s after the admission; the loop never got near the boundary", lastRefusalSent)
		}
	})

	t.Run("IndependentKeysAndNamespaces", func(t *testing.T) {
		lim, b := setup(t, time.Minute)
		other := mustNew(t, newLimiter, b.pool, &pglimit.Config{Schema: b.schema, Cooldown: time.Minute, Namespace: "other"})
		if d := mustAllow(t, lim, "a"); !d.Allowed {
			t.Fatalf("a: %+v", d)
		}
		if d := mustAllow(t, lim, "b"); !d.Allowed {
			t.Fatalf("b after a: %+v, want admitted", d)
		}
		if d := mustAllow(t, other, "a"); !d.Allowed {
			t.Fatalf("a in another namespace: %+v, want admitted", d)
		}
		if d := mustAllow(t, lim, "a"); d.Allowed {
			t.Fatalf("a again: %+v, want refused", d)
		}
	})

	t.Run("ResetLiftsCooldown", func(t *testing.T) {
		lim, _ := setup(t, time.Minute)
		mustAllow(t, lim, "k")
		if d := mustAllow(t, lim, "k"); d.Allowed {
			t.Fatalf("before reset: %+v, want refused", d)
		}
		if err := lim.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if d := mustAllow(t, lim, "k"); !d.Allowed {
			t.Fatalf("after reset: %+v, want admitted", d)
		}
		if err := lim.Reset(ctx, "never-seen"); err != nil {
			t.Fatalf("reset of an unknown key: %v", err)
		}
	})

	t.Run("InCallerTransaction", func(t *testing.T) {
		lim, b := setup(t, time.Minute)
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := lim.AllowTx(ctx, tx, "k"); err != nil || !d.Allowed {
			t.Fatalf("AllowTx: %+v, %v; want admitted", d, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if d := mustAllow(t, lim, "k"); !d.Allowed {
			t.Fatalf("after rollback: %+v, want admitted (a rolled-back admission is not consumed)", d)
		}

		tx, err = b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if d, err := lim.AllowTx(ctx, tx, "k2"); err != nil || !d.Allowed {
			t.Fatalf("AllowTx k2: %+v, %v; want admitted", d, err)
		}
		if d, err := lim.AllowTx(ctx, tx, "k"); err != nil || d.Allowed {
			t.Fatalf("AllowTx on a key in cooldown: %+v, %v; want refused", d, err)
		}
		var one int
		if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			t.Fatalf("caller's transaction unusable after a refusal: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if d := mustAllow(t, lim, "k2"); d.Allowed {
			t.Fatalf("after commit: %+v, want refused (a committed admission is consumed)", d)
		}
	})
}
