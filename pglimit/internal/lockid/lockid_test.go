package lockid

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

// The advisory lock ids are shared with every deployed instance: a new
// version that derived other ids would lead cleanups and run migrations
// beside an old one instead of waiting for it. The values are those the
// three derivations gave before Of replaced them.
func TestLockIDsAreStable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"setup", Setup, 713863278108963640},
		{"migrate public", Migration("public"), 2674034186184075529},
		{"migrate app", Migration("app"), 5379591202825642052},
		{"distribute", Distribute, 5814498278568982155},
		{"cleanup public default tables", Cleanup("public", []string{"pglimit_upsert", "pglimit_nowait", "pglimit_range"}), 960762848113060509},
		{"cleanup, tables in another order", Cleanup("public", []string{"pglimit_range", "pglimit_upsert", "pglimit_nowait"}), 960762848113060509},
		{"cleanup app unlogged", Cleanup("app", []string{"pglimit_upsert_unlogged"}), 4365070669541758876},
		{"key class public upsert default", int64(KeyClass(pgx.Identifier{"public", "pglimit_upsert"}.Sanitize(), "default")), 105733763},
		{"slots public", SlotSeed(pgx.Identifier{"public", "pglimit_slots"}.Sanitize()), 546734592180345143},
		{"key class app range export", int64(KeyClass(pgx.Identifier{"app", "pglimit_range"}.Sanitize(), "export")), -276386480},
	} {
		if c.got != c.want {
			t.Errorf("%s: lock id %d, want %d", c.name, c.got, c.want)
		}
	}
}
