package pglimittest

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// exerciseInput: bad input is refused with a typed error and changes
// nothing, hostile keys are only data, and the caller's context and the
// limiter's Timeout bound every decision.
func (s *suite) exerciseInput(t *testing.T) {
	setup := s.setup
	ctx := context.Background()
	newLimiter := s.newLimiter

	t.Run("BadInputChangesNothing", func(t *testing.T) {
		lim, b := setup(t, time.Minute)
		if d := mustAllow(t, lim, strings.Repeat("k", pglimit.MaxKeyLength)); !d.Allowed {
			t.Fatalf("key of exactly MaxKeyLength bytes: %+v, want admitted", d)
		}
		before := countRows(t, b)
		for name, key := range map[string]string{
			"empty":    "",
			"too long": strings.Repeat("k", pglimit.MaxKeyLength+1),
			"bad utf8": "user\xff",
			"nul byte": "a\x00b",
		} {
			if d, err := lim.Allow(ctx, key); !errors.Is(err, pglimit.ErrInvalidKey) || d != (pglimit.Decision{}) {
				t.Errorf("Allow(%s): %+v, %v; want ErrInvalidKey and a zero Decision", name, d, err)
			}
			if err := lim.Reset(ctx, key); !errors.Is(err, pglimit.ErrInvalidKey) {
				t.Errorf("Reset(%s): %v; want ErrInvalidKey", name, err)
			}
		}
		for name, cfg := range map[string]pglimit.Config{
			"zero cooldown":      {Cooldown: 0},
			"negative cooldown":  {Cooldown: -time.Second},
			"injected table":     {Cooldown: time.Second, Table: `pglimit_upsert; DROP TABLE pglimit_range; --`},
			"quoted schema":      {Cooldown: time.Second, Schema: `public"."x`},
			"bad namespace":      {Cooldown: time.Second, Namespace: "\xff"},
			"negative timeout":   {Cooldown: time.Second, Timeout: -time.Second},
			"upper-case table":   {Cooldown: time.Second, Table: "Limits"},
			"64-byte identifier": {Cooldown: time.Second, Table: strings.Repeat("t", 64)},
		} {
			cfg.Schema = cmp.Or(cfg.Schema, b.schema)
			if lim, err := newLimiter(b.pool, &cfg); !errors.Is(err, pglimit.ErrInvalidConfig) || lim != nil {
				t.Errorf("config %s: limiter %t, error %v; want ErrInvalidConfig and no limiter", name, lim != nil, err)
			}
		}
		if after := countRows(t, b); after != before {
			t.Fatalf("rows changed from %d to %d after bad input", before, after)
		}
	})

	t.Run("HostileKeysAreData", func(t *testing.T) {
		lim, b := setup(t, time.Minute)
		keys := []string{
			`'; DROP TABLE pglimit_upsert; --`,
			`" OR 1=1 --`,
			`$1`,
			`%s%d%[1]s`,
			`\x00`,
			"line\nbreak\ttab",
			"ключ-🔑",
		}
		for _, key := range keys {
			if d := mustAllow(t, lim, key); !d.Allowed {
				t.Fatalf("Allow(%q): %+v, want admitted", key, d)
			}
			if d := mustAllow(t, lim, key); d.Allowed {
				t.Fatalf("Allow(%q) again: %+v, want refused", key, d)
			}
		}
		// Every table survived (countRows reads all three), one row per key.
		if n := countRows(t, b); n != int64(len(keys)) {
			t.Fatalf("%d rows after %d hostile keys, want one each", n, len(keys))
		}
	})

	t.Run("ContextBoundsTheDecision", func(t *testing.T) {
		lim, b := setup(t, time.Minute)
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := lim.Allow(cancelled, "k"); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled context: %v, want context.Canceled", err)
		}

		// Hold the key in an open transaction: the next decision either
		// waits on it (and must give up with the context) or is refused.
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if d, err := lim.AllowTx(ctx, tx, "k"); err != nil || !d.Allowed {
			t.Fatalf("AllowTx: %+v, %v", d, err)
		}
		const bound = 10 * time.Second // catches a hang, not a slow machine
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		d, err := lim.Allow(short, "k")
		if elapsed := time.Since(start); elapsed > bound {
			t.Fatalf("Allow took %s with a 200ms context", elapsed)
		}
		if err == nil && d.Allowed {
			t.Fatalf("admitted while another transaction holds an admission")
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error %v, want one wrapping context.DeadlineExceeded", err)
		}

		timed := mustNew(t, newLimiter, b.pool, &pglimit.Config{Schema: b.schema, Cooldown: time.Minute, Timeout: 200 * time.Millisecond})
		start = time.Now()
		d, err = timed.Allow(ctx, "k")
		if elapsed := time.Since(start); elapsed > bound {
			t.Fatalf("Allow took %s with a 200ms Timeout", elapsed)
		}
		if err == nil && d.Allowed {
			t.Fatalf("admitted while another transaction holds an admission")
		}
		if err != nil && !errors.Is(err, pglimit.ErrTimeout) {
			t.Fatalf("error %v, want one wrapping ErrTimeout", err)
		}
	})
}
