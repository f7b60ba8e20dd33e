package cleanup_test

import (
	"testing"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit/internal/cleanup"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Only a table without an index on expires_at is swept by blocks.
func TestDescribeSweep(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	for table, want := range map[string]bool{
		"pglimit_upsert":          true,
		"pglimit_nowait":          true,
		"pglimit_range":           false,
		"pglimit_upsert_unlogged": true,
		"pglimit_nowait_unlogged": true,
	} {
		tb, err := cleanup.Describe(t.Context(), pool, schema, table)
		if err != nil {
			t.Fatal(err)
		}
		if tb.Sweep != want {
			t.Errorf("%s: Sweep %t, want %t", table, tb.Sweep, want)
		}
	}
	if _, err := pool.Exec(t.Context(), "CREATE INDEX ON "+schema+".pglimit_nowait (expires_at)"); err != nil {
		t.Fatal(err)
	}
	if tb, err := cleanup.Describe(t.Context(), pool, schema, "pglimit_nowait"); err != nil || tb.Sweep {
		t.Errorf("pglimit_nowait with an index on expires_at: %+v, %v; want no Sweep", tb, err)
	}
}
