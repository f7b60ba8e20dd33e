package pglimitquota_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// bundle is a test's quota on a clock it moves, with what it needs to
// look at the tables.
type bundle struct {
	clock  *pglimittest.Clock
	pool   *pgxpool.Pool // the clock's
	admin  *pgxpool.Pool // reads the tables, on the real clock
	schema string
	q      *pglimitquota.Quota
}

// setup makes a quota of cfg (Namespace "n" unless set) in a fresh
// schema, on a clock set to at when at is not zero.
func setup(t *testing.T, cfg pglimitquota.Config, at time.Time) *bundle {
	t.Helper()
	b := &bundle{clock: pglimittest.NewClock(t), schema: testdb.Schema(t), admin: testdb.Pool(t)}
	if !at.IsZero() {
		b.clock.Set(at)
	}
	b.pool = b.clock.Pool(t)
	cfg.Schema = b.schema
	if cfg.Namespace == "" {
		cfg.Namespace = "n"
	}
	q, err := pglimitquota.New(b.pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.q = q
	return b
}

// twoInstances is two quotas of cfg, as two instances of a service
// would have: one on db, one through PgBouncer.
func twoInstances(t *testing.T, db pglimit.DB, cfg pglimitquota.Config) []*pglimitquota.Quota {
	t.Helper()
	var quotas []*pglimitquota.Quota
	for _, pool := range []pglimit.DB{db, testdb.PgBouncerPool(t)} {
		q, err := pglimitquota.New(pool, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		quotas = append(quotas, q)
	}
	return quotas
}

// count returns the number of rows of a table of the schema.
func (b *bundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := b.admin.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{b.schema, table}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// dump returns every row of the quota's tables, as text, to compare
// before and after a call that must write nothing.
func (b *bundle) dump(t *testing.T) string {
	t.Helper()
	var out string
	for _, table := range []string{"pglimit_quota_keys", "pglimit_quota_ids", "pglimit_quota_events"} {
		var s *string
		sql := "SELECT string_agg(t::text, E'\\n' ORDER BY t::text) FROM " + pgx.Identifier{b.schema, table}.Sanitize() + " AS t"
		if err := b.admin.QueryRow(context.Background(), sql).Scan(&s); err != nil {
			t.Fatal(err)
		}
		if s != nil {
			out += table + ":\n" + *s + "\n"
		}
	}
	return out
}

// at parses a time in zone.
func at(t *testing.T, zone, s string) time.Time {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	v, err := time.ParseInLocation("2006-01-02 15:04:05.999999", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// allow is q.Allow that fails the test on an error.
func allow(t *testing.T, ctx context.Context, q *pglimitquota.Quota, key string, cost int64) pglimitquota.Decision {
	t.Helper()
	d, err := q.Allow(ctx, key, cost)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
