package pglimitquota

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
)

// Forget's statement reads the key's ids through their index by key
// (migration 00017) on a table of 100,000 ids, not by scanning it. It
// logs the table's bytes per id, with and without that index (an id of
// 36 bytes, a UUID; a namespace of 20 bytes; keys "user-N"), for 1,000
// keys of 100 ids each and, without -short, 100,000 keys of one id each:
// the figures in docs/limits.md ("Billing periods", Growth).
func TestForgetUsesKeyIndex(t *testing.T) {
	keys := []int{1000}
	if !testing.Short() {
		keys = append(keys, 100_000)
	}
	for _, k := range keys {
		schema := testdb.Schema(t)
		admin := testdb.Pool(t)
		ctx := context.Background()
		q, err := New(admin, &Config{Schema: schema, Namespace: "namespace-of-20-byte"})
		if err != nil {
			t.Fatal(err)
		}
		ids := pgx.Identifier{schema, idsTable}.Sanitize()
		_, err = admin.Exec(ctx, `INSERT INTO `+ids+` (namespace, id, key, answer, period_start, period_end, decided_at, expires_at)
			SELECT 'namespace-of-20-byte', gen_random_uuid()::text, 'user-' || (g % $1::integer), ARRAY[1, 1, 0, 0, g, 0, 0, 1000000, 1000000, 0]::bigint[],
			       now(), now() + interval '1 month', now() + g * interval '1 ms', now() + interval '1 day' + g * interval '1 ms'
			FROM generate_series(1, 100000) AS g`, k)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, "VACUUM ANALYZE "+ids); err != nil {
			t.Fatal(err)
		}
		if p := plan(t, admin, "EXPLAIN "+q.stmts.forget, q.cfg.Namespace, "user-5"); !strings.Contains(p, "pglimit_quota_ids_key_idx") || strings.Contains(p, "Seq Scan on pglimit_quota_ids") {
			t.Fatalf("Forget's plan does not read the ids by key:\n%s", p)
		}
		var total, index int64
		err = admin.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass), pg_relation_size(($2 || '.pglimit_quota_ids_key_idx')::regclass)`,
			ids, pgx.Identifier{schema}.Sanitize()).Scan(&total, &index)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d keys: %.1f B per id (pg_total_relation_size), %.1f B of them the index by key; %.1f B without it",
			k, float64(total)/1e5, float64(index)/1e5, float64(total-index)/1e5)
	}
}

// A decision with an id looks the id up by the ids' primary key, never
// through their index by key, whose leading column is the key for that
// reason: an index led by the namespace served "namespace = $1", and a
// generic plan made while the table was small scanned every id of the
// namespace on every decision (BenchmarkAllow's decisions with an id
// took 1.2-1.3x a fixed window instead of 0.85-0.88x). Checked on the
// generic plans of an empty table, the state a fresh deployment's
// connections cache them in.
func TestIDLookupsByPrimaryKey(t *testing.T) {
	ctx := context.Background()
	schema := testdb.Schema(t)
	q, err := New(testdb.Pool(t), &Config{Schema: schema, Namespace: "n", Allowance: 10, Thresholds: []float64{0.8}})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	for _, st := range []struct{ name, sql, args string }{
		{"allow_kept_id", q.stmts.keptID, "'n', 'k', 10, 10, 1, 'id', 1000, '{8000}'"},
		{"allow_id", q.stmts.allowID, "'n', 'k', 1, 'UTC', 10, 10, 1, 'id', 1000, '{8000}'"},
		{"lookup_id", q.stmts.lookupID, "'n', 'id'"},
	} {
		if _, err := conn.Prepare(ctx, st.name, st.sql); err != nil {
			t.Fatal(err)
		}
		if p := plan(t, conn, "EXPLAIN EXECUTE "+st.name+"("+st.args+")"); !strings.Contains(p, "pglimit_quota_ids_pkey") || strings.Contains(p, "pglimit_quota_ids_key_idx") {
			t.Errorf("%s's generic plan does not look the id up by the primary key:\n%s", st.name, p)
		}
	}
}

// plan is the text of the plan that the EXPLAIN sql prints on db.
func plan(t *testing.T, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, sql string, args ...any) string {
	t.Helper()
	rows, err := db.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
