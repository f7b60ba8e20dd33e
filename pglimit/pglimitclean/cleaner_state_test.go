package pglimitclean_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
)

// Inspect names the leading session while a cleaner leads and none
// after it stops, and counts each table's due rows and how long overdue
// the oldest is.
func TestInspect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	upsert := pgx.Identifier{schema, "pglimit_upsert"}.Sanitize()
	// Due since 50 minutes (ended an hour ago, at 10 minutes' retention),
	// due since 10 minutes, and two rows that are not due.
	if _, err := pool.Exec(ctx, `INSERT INTO `+upsert+` (namespace, key, expires_at) VALUES
		('n', 'a', now() - interval '60 minutes'), ('n', 'b', now() - interval '20 minutes'),
		('n', 'c', now() - interval '5 minutes'), ('n', 'd', now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	cfg := &pglimitclean.Config{Schema: schema, Tables: []string{"pglimit_upsert", "pglimit_range"}, Interval: time.Hour}
	st, err := pglimitclean.Inspect(ctx, pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st.Leader != nil || len(st.Tables) != 2 {
		t.Fatalf("with no cleaner: %+v, want no leader and two tables", st)
	}
	up := st.Tables[0]
	if up.Table != "pglimit_upsert" || up.Due != 2 || up.Overdue < 49*time.Minute || up.Overdue > 51*time.Minute || up.Bytes <= 0 {
		t.Errorf("pglimit_upsert: %+v, want 2 due, the oldest 50 minutes overdue", up)
	}
	if r := st.Tables[1]; r.Due != 0 || r.Overdue != 0 {
		t.Errorf("an empty pglimit_range: %+v, want nothing due", r)
	}

	c, err := pglimitclean.New(testdb.Pool(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for !c.Stats().Leader {
		time.Sleep(20 * time.Millisecond)
	}
	st, err = pglimitclean.Inspect(ctx, pool, cfg)
	if err != nil || st.Leader == nil || st.Leader.PID == 0 || st.Leader.Connected.IsZero() {
		t.Errorf("while a cleaner leads: %+v, %v; want its session", st.Leader, err)
	}
	other, err := pglimitclean.Inspect(ctx, pool, &pglimitclean.Config{Schema: schema, Tables: []string{"pglimit_upsert"}})
	if err != nil || other.Leader != nil {
		t.Errorf("another set of tables: %+v, %v; want no leader of its own", other.Leader, err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// The leader's backend ends just after its client closes the
	// connection, and its lock with it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err = pglimitclean.Inspect(ctx, pool, cfg)
		if err != nil || st.Leader == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || st.Leader != nil {
		t.Errorf("10 s after Stop: %+v, %v; want no leader", st.Leader, err)
	}

	_, err = pglimitclean.Inspect(ctx, pool, &pglimitclean.Config{Schema: schema, Tables: []string{"missing"}})
	if !errors.Is(err, pglimit.ErrInvalidConfig) {
		t.Errorf("a missing table: %v, want ErrInvalidConfig", err)
	}
}
