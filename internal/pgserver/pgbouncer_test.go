package pgserver

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PgBouncer pools transactions in front of a server: two clients that stay
// connected, querying one after the other, are served by one server
// session (with session pooling each would hold its own). Its directory
// goes with it.
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	s := startTestServer(t, &Config{Prefer: "local", Logf: t.Logf})
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b, err := StartPgBouncer(ctx, s.URL())
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	cfg, err := pgx.ParseConfig(b.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	var pids [2]int32
	for i := range pids {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pids[i]); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	if pids[0] != pids[1] {
		t.Errorf("two clients in turn were served by server sessions %d and %d: not transaction pooling", pids[0], pids[1])
	}
	dir := b.dir
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("PgBouncer's directory %s is left behind: %v", dir, err)
	}
}
