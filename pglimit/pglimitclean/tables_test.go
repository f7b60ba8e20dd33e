package pglimitclean_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
)

// The cleaner deletes the ids whose retention ended (more than its own
// Retention ago), and keeps the others: an id it deleted is decided afresh.
func TestCleanerDeletesExpiredIDs(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := newFleet(t, 1, func(c *pglimitclean.Config) { c.Retention = time.Nanosecond })
	lim, err := pglimit.New(f.admin, &pglimit.Config{Schema: f.schema, Limits: []pglimit.Limit{{Rate: 100, Period: time.Hour, Burst: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"old", "kept"} {
		if d, err := lim.Allow(pglimit.WithID(ctx, id), "k"); err != nil || !d.Allowed {
			t.Fatalf("Allow %s: %+v, %v", id, d, err)
		}
	}
	ids := pgx.Identifier{f.schema, "pglimit_ids"}.Sanitize()
	// As if old's day of retention had passed.
	if _, err := f.admin.Exec(ctx, "UPDATE "+ids+" SET expires_at = now() - interval '1 second' WHERE id = 'old'"); err != nil {
		t.Fatal(err)
	}
	f.w.until(t, "old deleted", func() bool { return f.count(t, "pglimit_ids", "id = 'old'") == 0 })
	if n := f.count(t, "pglimit_ids", "id = 'kept'"); n != 1 {
		t.Fatalf("the id within its retention was deleted (%d rows)", n)
	}
	if d, err := lim.Allow(pglimit.WithID(ctx, "old"), "k"); err != nil || !d.Allowed || d.Replayed {
		t.Errorf("old after its deletion = %+v, %v, want decided afresh", d, err)
	}
	if d, err := lim.Allow(pglimit.WithID(ctx, "kept"), "k"); err != nil || !d.Replayed {
		t.Errorf("kept = %+v, %v, want replayed", d, err)
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
	f.add(t, func(c *pglimitclean.Config) { c.Tables = tables })
	f.w.until(t, "the unlogged tables cleaned", func() bool {
		return f.count(t, tables[0], "true") == 0 && f.count(t, tables[1], "true") == 0
	})
}

// runs records the cleanup runs an Observer sees, and pokes w after each.
type runs struct {
	w    *watch
	mu   sync.Mutex
	seen []pglimitclean.Observation
}

func (r *runs) ObserveCleanup(_ context.Context, o pglimitclean.Observation) {
	r.mu.Lock()
	r.seen = append(r.seen, o)
	r.mu.Unlock()
	r.w.poke()
}

// Each cleanup run of the leader is seen, with the rows it deleted.
func TestObserverCleanup(t *testing.T) {
	t.Parallel()
	obs := &runs{w: newWatch()}
	f := newFleet(t, 1, func(cfg *pglimitclean.Config) { cfg.Observer = obs })
	f.seedKeys(t, "pglimit_upsert", "old-", 20, "-1 hour")
	rows := func() (n int64) {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		for _, c := range obs.seen {
			n += c.Rows
		}
		return n
	}
	obs.w.until(t, "the run seen", func() bool { return rows() == 20 })
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for _, c := range obs.seen {
		if c.Schema != f.schema || c.Err != nil {
			t.Errorf("cleanup %+v", c)
		}
	}
}
