package pglimittest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// NewLimiter builds the limiter under test over db from cfg, which carries
// the schema, namespace and cooldown a test chose; it sets the strategy and
// any option it exercises.
type NewLimiter func(db pglimit.DB, cfg *pglimit.Config) (pglimit.Limiter, error)

// Option changes how [Exercise] connects.
type Option func(*options)

type options struct {
	pool    func(testing.TB) *pgxpool.Pool
	url     string                                                             // "" for the shared server
	prepare func(ctx context.Context, pool *pgxpool.Pool, schema string) error // after Migrate; nil for none
}

// WithPool makes the suite's limiters and transactions use pools from
// newPool, such as pools through PgBouncer, instead of [Pool].
func WithPool(newPool func(testing.TB) *pgxpool.Pool) Option {
	return func(o *options) { o.pool = newPool }
}

// OnServer runs the suite against the server at url instead of the shared
// one: its pools connect there, and each test's schema is created there,
// migrated, then handed to prepare (pglimit.Distribute, say, on a Citus
// coordinator) when prepare is not nil.
func OnServer(url string, prepare func(ctx context.Context, pool *pgxpool.Pool, schema string) error) Option {
	return func(o *options) {
		o.url, o.prepare = url, prepare
		o.pool = func(tb testing.TB) *pgxpool.Pool { return testdb.PoolOn(tb, url) }
	}
}

// serverURL is the URL of the server the suite runs against.
func (o *options) serverURL(tb testing.TB) string {
	if o.url != "" {
		return o.url
	}
	return URL(tb)
}

// Exercise runs the conformance suite every strategy must pass against a
// real PostgreSQL. Each subtest uses its own schema and runs in parallel.
func Exercise(t *testing.T, newLimiter NewLimiter, opts ...Option) {
	t.Helper()
	o := options{pool: Pool}
	for _, opt := range opts {
		opt(&o)
	}

	s := &suite{newLimiter: newLimiter, opts: o}
	setup := s.setup
	ctx := context.Background()

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

	t.Run("ConcurrentOneKeyAdmitsOne", func(t *testing.T) {
		lim, _ := setup(t, time.Minute)
		admitted, errs := race(ctx, []pglimit.Limiter{lim}, 10, "hot")
		if errs != nil || admitted != 1 {
			t.Fatalf("10 concurrent requests: %d admitted, errors %v; want exactly 1 admitted and no error", admitted, errs)
		}
	})

	t.Run("TwoInstancesAdmitOne", func(t *testing.T) {
		lim1, b := setup(t, time.Minute)
		lim2 := mustNew(t, newLimiter, o.pool(t), &pglimit.Config{Schema: b.schema, Cooldown: time.Minute})
		admitted, errs := race(ctx, []pglimit.Limiter{lim1, lim2}, 200, "hot")
		if errs != nil || admitted != 1 {
			t.Fatalf("200 requests over two pools: %d admitted, errors %v; want exactly 1 admitted and no error", admitted, errs)
		}
	})

	t.Run("ConcurrentAfterCooldownAdmitsOne", func(t *testing.T) {
		// Each key's row exists and its cooldown has ended: every racer
		// sees an admissible row, so only the row lock keeps them apart.
		// One race per key, so a narrow window still gets hit.
		const cooldown = time.Second
		lim1, b := setup(t, cooldown)
		lim2 := mustNew(t, newLimiter, o.pool(t), &pglimit.Config{Schema: b.schema, Cooldown: cooldown})
		keys := make([]string, 25)
		for i := range keys {
			keys[i] = fmt.Sprintf("hot-%d", i)
			mustAllow(t, lim1, keys[i])
		}
		time.Sleep(cooldown + 50*time.Millisecond)
		start := time.Now()
		admitted := make(map[string]int, len(keys))
		for _, key := range keys {
			n, errs := race(ctx, []pglimit.Limiter{lim1, lim2}, 8, key)
			if errs != nil {
				t.Fatalf("key %s: errors: %v", key, errs)
			}
			admitted[key] = n
		}
		// A race slower than the cooldown may rightly admit again.
		most := 1 + int(time.Since(start)/cooldown)
		for _, key := range keys {
			if n := admitted[key]; n < 1 || n > most {
				t.Errorf("key %s: %d of 8 concurrent requests admitted after the cooldown; want 1 (at most %d)", key, n, most)
			}
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

	s.exerciseTransactions(t)
	s.exerciseClock(t)
	s.exerciseIsolation(t)
	s.exerciseBusyKey(t)
}

// suite is what the parts of [Exercise] share.
type suite struct {
	newLimiter NewLimiter
	opts       options
}

// setup marks t parallel and returns a limiter with cooldown over a new
// schema, and the schema and pool it uses.
func (s *suite) setup(t *testing.T, cooldown time.Duration) (pglimit.Limiter, *bundle) {
	t.Helper()
	t.Parallel()
	b := &bundle{schema: testdb.SchemaOn(t, s.opts.serverURL(t), s.opts.prepare), pool: s.opts.pool(t)}
	return mustNew(t, s.newLimiter, b.pool, &pglimit.Config{Schema: b.schema, Cooldown: cooldown}), b
}

func mustNew(t *testing.T, newLimiter NewLimiter, db pglimit.DB, cfg *pglimit.Config) pglimit.Limiter {
	t.Helper()
	lim, err := newLimiter(db, cfg)
	if err != nil {
		t.Fatalf("new limiter: %v", err)
	}
	return lim
}

func mustAllow(t *testing.T, lim pglimit.Limiter, key string) pglimit.Decision {
	t.Helper()
	d, err := lim.Allow(context.Background(), key)
	if err != nil {
		t.Fatalf("Allow(%q): %v", key, err)
	}
	return d
}

// race sends n requests for key at once, spread over the limiters, and
// returns how many were admitted and every error.
func race(ctx context.Context, lims []pglimit.Limiter, n int, key string) (admitted int, errs error) {
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for i := range n {
		wg.Go(func() {
			<-start
			d, err := lims[i%len(lims)].Allow(ctx, key)
			mu.Lock()
			defer mu.Unlock()
			if d.Allowed {
				admitted++
			}
			errs = errors.Join(errs, err)
		})
	}
	close(start)
	wg.Wait()
	return admitted, errs
}

type bundle struct {
	pool   *pgxpool.Pool
	schema string
}

// countRows counts the rows of every pglimit table in the test's schema.
func countRows(t *testing.T, b *bundle) int64 {
	t.Helper()
	var n int64
	for _, table := range []string{"pglimit_upsert", "pglimit_nowait", "pglimit_range", "pglimit_upsert_unlogged", "pglimit_nowait_unlogged"} {
		var c int64
		q := "SELECT count(*) FROM " + pgx.Identifier{b.schema, table}.Sanitize()
		if err := b.pool.QueryRow(context.Background(), q).Scan(&c); err != nil {
			t.Fatalf("count rows of %s: %v", table, err)
		}
		n += c
	}
	return n
}
