package pglimittest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
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
// one.
//
// The suite's pools connect there, and each test's schema is created
// there, migrated, then handed to prepare (pglimit.Distribute, say, on a
// Citus coordinator) when prepare is not nil.
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
// real PostgreSQL. Each subtest uses its own schema and runs in parallel;
// each area is in a file of its own (exercise_<area>.go).
func Exercise(t *testing.T, newLimiter NewLimiter, opts ...Option) {
	t.Helper()
	o := options{pool: Pool}
	for _, opt := range opts {
		opt(&o)
	}

	s := &suite{newLimiter: newLimiter, opts: o}
	s.exerciseBasics(t)
	s.exerciseRaces(t)
	s.exerciseInput(t)
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
