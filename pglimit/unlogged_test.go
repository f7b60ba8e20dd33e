package pglimit_test

import (
	"testing"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// The unlogged tables keep every promise, for the strategies whose shape
// they have.
func TestConformanceUnlogged(t *testing.T) {
	testdb.Slow(t)
	t.Parallel()
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			pglimittest.Exercise(t, withStrategy(s, func(c *pglimit.Config) {
				if c.Table == "" { // the suite sets bad names of its own
					c.Table = "pglimit_" + string(s) + "_unlogged"
				}
			}))
		})
	}
}

// Migrate creates the unlogged tables unlogged, and the cleanup job cleans
// them when they are listed.
func TestUnloggedTables(t *testing.T) {
	t.Parallel()
	tables := []string{"pglimit_upsert_unlogged", "pglimit_nowait_unlogged"}
	f := newFleet(t, 0, nil)
	for _, table := range tables {
		var persistence string
		q := `SELECT relpersistence::text FROM pg_class WHERE oid = to_regclass($1)`
		if err := f.admin.QueryRow(t.Context(), q, f.table(table)).Scan(&persistence); err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		if persistence != "u" {
			t.Errorf("%s has relpersistence %q, want u (unlogged)", table, persistence)
		}
		f.seedKeys(t, table, "k", 50, "-1 hour")
	}
	f.add(t, func(c *pglimit.CleanerConfig) { c.Tables = tables })
	f.w.until(t, "the unlogged tables cleaned", func() bool {
		return f.count(t, tables[0], "true") == 0 && f.count(t, tables[1], "true") == 0
	})
}
