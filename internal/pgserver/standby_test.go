package pgserver

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A standby of a local cluster follows it read-only, and writes once
// promoted.
func TestServerStandby(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	primary := startTestServer(t, &Config{Prefer: KindLocal, Logf: t.Logf})
	standby, err := primary.Standby(ctx)
	if err != nil {
		t.Fatalf("Standby: %v", err)
	}
	t.Cleanup(func() {
		if err := standby.Close(); err != nil {
			t.Errorf("Close(standby): %v", err)
		}
	})
	p := connect(t, primary.URL())
	if _, err := p.Exec(ctx, "CREATE TABLE replicated (v int); INSERT INTO replicated VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	s := connect(t, standby.URL())
	var recovery bool
	if err := s.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovery); err != nil || !recovery {
		t.Fatalf("standby: pg_is_in_recovery() = %v, %v", recovery, err)
	}
	var v int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := s.QueryRow(ctx, "SELECT v FROM replicated").Scan(&v)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby did not replay the primary's table: %v", err)
		}
	}
	if _, err := s.Exec(ctx, "INSERT INTO replicated VALUES (8)"); err == nil {
		t.Fatal("the standby accepted a write")
	}
	var promoted bool
	if err := s.QueryRow(ctx, "SELECT pg_promote()").Scan(&promoted); err != nil || !promoted {
		t.Fatalf("pg_promote() = %v, %v", promoted, err)
	}
	if _, err := s.Exec(ctx, "INSERT INTO replicated VALUES (8)"); err != nil {
		t.Fatalf("the promoted standby refused a write: %v", err)
	}
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// A cluster whose postmaster was killed alone, with a backend left behind,
// restarts on its data.
func TestServerKillRestart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := startTestServer(t, &Config{Prefer: KindLocal, Durable: true, Logf: t.Logf})
	held := connect(t, s.URL())
	if _, err := held.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(ctx, true); err != nil {
		t.Fatalf("Restart after Kill: %v", err)
	}
	var v int
	if err := connect(t, s.URL()).QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != 7 {
		t.Fatalf("after the restart: %d, %v", v, err)
	}
}
