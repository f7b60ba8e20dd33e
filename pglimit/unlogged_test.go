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
