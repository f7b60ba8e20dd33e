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
		rows, err := admin.Query(ctx, "EXPLAIN "+q.stmts.forget, q.cfg.Namespace, "user-5")
		if err != nil {
			t.Fatal(err)
		}
		var plan strings.Builder
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(line + "\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if p := plan.String(); !strings.Contains(p, "pglimit_quota_ids_key_idx") || strings.Contains(p, "Seq Scan on pglimit_quota_ids") {
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
