package pgserver

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestServerLocal(t *testing.T) {
	t.Parallel()
	s := startTestServer(t, &Config{Prefer: "local", Logf: t.Logf})
	if s.Kind() != "local" {
		t.Fatalf("Kind() = %q, want local", s.Kind())
	}
	checkTestServer(t, s, "off")

	// A borrowed URL is used as is and never stopped.
	borrowed, err := Start(t.Context(), &Config{URL: s.URL()})
	if err != nil {
		t.Fatalf("Start(URL): %v", err)
	}
	if borrowed.Kind() != "url" || borrowed.URL() != s.URL() {
		t.Fatalf("borrowed server: kind %q url %q", borrowed.Kind(), borrowed.URL())
	}
	if err := borrowed.Close(); err != nil {
		t.Fatalf("Close(url): %v", err)
	}
	checkTestServer(t, s, "off")

	closeAndCheckGone(t, s)
}

func TestServerAuto(t *testing.T) {
	t.Parallel()
	// Durable here so that both settings are covered without a third server.
	s := startTestServer(t, &Config{Durable: true, Logf: t.Logf})
	t.Logf("auto mode chose %q", s.Kind())
	checkTestServer(t, s, "on")
	closeAndCheckGone(t, s)
}

func TestServerBinDir(t *testing.T) {
	t.Parallel()
	if _, err := Start(t.Context(), &Config{Prefer: KindLocal, BinDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "BinDir") {
		t.Fatalf("Start with an empty BinDir: got %v, want an error naming BinDir", err)
	}
	bin, err := findLocalBinaries("")
	if err != nil {
		t.Skipf("no local binaries: %v", err)
	}
	s := startTestServer(t, &Config{Prefer: KindLocal, BinDir: bin.dir})
	if !strings.Contains(s.Source(), bin.dir) {
		t.Fatalf("Source() = %q, want it to name %s", s.Source(), bin.dir)
	}
	checkTestServer(t, s, "off")
}

func TestServerBogusPrefer(t *testing.T) {
	t.Parallel()
	s, err := Start(t.Context(), &Config{Prefer: "bogus"})
	if err == nil {
		s.Close()
		t.Fatal("Start with Prefer bogus: want an error")
	}
	if !strings.Contains(err.Error(), "Prefer") {
		t.Fatalf("error %q does not name the field", err)
	}
	// A typo must not hide behind a URL either.
	if _, err := Start(t.Context(), &Config{Prefer: "bogus", URL: "postgres://127.0.0.1:1/postgres"}); err == nil {
		t.Fatal("Start with Prefer bogus and a URL: want an error")
	}
}

func TestServerUnavailableMessage(t *testing.T) {
	t.Parallel()
	msg := serverUnavailable(&Config{}, []string{"local: nothing"}).Error()
	for _, want := range []string{"PGLIMIT_TEST_DATABASE_URL", "Docker", "apt-get install postgresql postgresql-contrib", "local: nothing"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
}

func TestServerCompareVersions(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		a, b string
		want int
	}{
		{"15", "16", -1},
		{"9.6", "15", -1},
		{"16", "16", 0},
		{"17", "9.6", 1},
	} {
		if got := serverCompareVersions(tt.a, tt.b); got != tt.want {
			t.Errorf("serverCompareVersions(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

func startTestServer(t *testing.T, cfg *Config) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// checkTestServer checks what the library relies on: btree_gist, the
// durability setting asked for, and synchronous_commit left alone.
func checkTestServer(t *testing.T, s *Server, wantFsync string) {
	t.Helper()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS btree_gist"); err != nil {
		t.Fatalf("create btree_gist: %v", err)
	}
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
	if s.Kind() == "url" {
		return // someone else's settings
	}
	for name, want := range map[string]string{
		"fsync":              wantFsync,
		"full_page_writes":   wantFsync,
		"synchronous_commit": "on",
		"max_connections":    "300",
	} {
		var got string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&got); err != nil {
			t.Fatalf("current_setting(%s): %v", name, err)
		}
		if got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
}

func closeAndCheckGone(t *testing.T, s *Server) {
	t.Helper()
	u, err := url.Parse(s.URL())
	if err != nil {
		t.Fatalf("parse URL: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if s.Kind() == "url" {
		return
	}
	if s.Kind() == "local" {
		if _, err := os.Stat(s.dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("temp dir %s still there after Close (stat err %v)", s.dir, err)
		}
	}
	if c, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Close", u.Host)
	}
}
