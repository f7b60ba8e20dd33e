package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithttp"
)

func TestParseConfig(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string {
		return func(k string) string { return m[k] }
	}

	c, err := parseConfig(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.addr != "127.0.0.1:8080" || c.strategy != pglimit.Upsert || c.cooldown != 2*time.Second || !c.migrate ||
		c.schema != "public" || c.onError != pglimithttp.Unavailable || c.databaseURL != "" || c.maxUsers != 100 || c.instance == "" ||
		!c.cleanup || c.cleanupInterval != 30*time.Second || c.cleanupRetention != time.Minute ||
		c.itemsPerMinute != 5 || c.itemsBurst != 3 || c.itemsPerDay != 20 {
		t.Fatalf("defaults: %+v", c)
	}

	c, err = parseConfig([]string{"-strategy", "range", "-addr", ":1", "-items-burst", "2"}, env(map[string]string{
		"PGLIMIT_ITEMS_PER_MINUTE":  "10",
		"PGLIMIT_ITEMS_BURST":       "4", // the flag wins
		"PGLIMIT_ITEMS_PER_DAY":     "100",
		"PGLIMIT_STRATEGY":          "nowait", // the flag wins
		"PGLIMIT_COOLDOWN":          "250ms",
		"DATABASE_URL":              "postgres://db/x",
		"PGLIMIT_MIGRATE":           "false",
		"PGLIMIT_ON_ERROR":          "fail-open",
		"PGLIMIT_DEMO_ADDR":         ":2",
		"PGLIMIT_CLEANUP":           "false",
		"PGLIMIT_CLEANUP_INTERVAL":  "5s",
		"PGLIMIT_CLEANUP_RETENTION": "1ns",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.addr != ":1" || c.strategy != pglimit.Range || c.cooldown != 250*time.Millisecond || c.migrate ||
		c.onError != pglimithttp.FailOpen || c.databaseURL != "postgres://db/x" ||
		c.cleanup || c.cleanupInterval != 5*time.Second || c.cleanupRetention != time.Nanosecond ||
		c.itemsPerMinute != 10 || c.itemsBurst != 2 || c.itemsPerDay != 100 || c.databaseFrom != "DATABASE_URL" {
		t.Fatalf("flags and env: %+v", c)
	}
	if c, err := parseConfig([]string{"-database-url", "postgres://db/y"}, env(map[string]string{"DATABASE_URL": "postgres://db/x"}), io.Discard); err != nil ||
		c.databaseURL != "postgres://db/y" || c.databaseFrom != "-database-url" {
		t.Errorf("-database-url over DATABASE_URL: %+v, %v", c, err)
	}
	if c, err := parseConfig(nil, env(nil), io.Discard); err != nil || c.databaseFrom != "" {
		t.Errorf("no database URL: from %q, %v", c.databaseFrom, err)
	}

	for _, args := range [][]string{
		{"-strategy", "redis"},
		{"-cooldown", "0s"},
		{"-cooldown", "soon"},
		{"-migrate", "perhaps"},
		{"-schema", "Public; DROP"},
		{"-on-error", "ignore"},
		{"-metrics-max-users", "-1"},
		{"-cleanup", "perhaps"},
		{"-items-per-minute", "0"},
		{"-items-burst", "-1"},
		{"-items-per-day", "0"},
		{"-items-per-day", "many"},
		{"-cleanup-interval", "0s"},
		{"-cleanup-retention", "0s"},
		{"-cleanup-retention", "-1m"},
		{"-nope"},
		{"extra"},
	} {
		if _, err := parseConfig(args, env(nil), io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	for name, v := range map[string]string{
		"PGLIMIT_COOLDOWN":          "-1s",
		"PGLIMIT_MIGRATE":           "perhaps",
		"PGLIMIT_DEMO_MAX_USERS":    "many",
		"PGLIMIT_STRATEGY":          "redis",
		"PGLIMIT_CLEANUP":           "perhaps",
		"PGLIMIT_ITEMS_PER_MINUTE":  "0",
		"PGLIMIT_ITEMS_BURST":       "lots",
		"PGLIMIT_ITEMS_PER_DAY":     "-5",
		"PGLIMIT_CLEANUP_INTERVAL":  "often",
		"PGLIMIT_CLEANUP_RETENTION": "-1s",
	} {
		_, err := parseConfig(nil, env(map[string]string{name: v}), io.Discard)
		if err == nil {
			t.Errorf("%s=%s: no error", name, v)
		}
	}
	if c, err := parseConfig([]string{"-migrate"}, env(map[string]string{"PGLIMIT_MIGRATE": "false"}), io.Discard); err != nil || !c.migrate {
		t.Errorf("-migrate alone over PGLIMIT_MIGRATE=false: %+v, %v", c, err)
	}
}

// syncBuffer is a log sink that the server goroutines and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRunWithThrowawayPostgres is `go run ./demo` with nothing configured:
// it must start its own PostgreSQL, serve, and clean up on shutdown.
func TestRunWithThrowawayPostgres(t *testing.T) {
	t.Parallel()
	if os.Getenv(testdb.EnvURL) != "" {
		t.Skipf("%s is set: tests may have no local PostgreSQL to start", testdb.EnvURL)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	var logs syncBuffer
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-instance", "throwaway"},
			func(string) string { return "" }, &logs, func(addr string) { addrc <- addr })
	}()

	var addr string
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("run ended before listening: %v\n%s", err, logs.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("not listening after 2 minutes:\n%s", logs.String())
	}
	for i, want := range []int{200, 429} {
		resp, err := http.Get("http://" + addr + "/items/alice")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("call %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no shutdown within 30s:\n%s", logs.String())
	}
	// In this order: the cleanup job stops before the database does.
	out, at := logs.String(), 0
	for _, want := range []string{"starting a throwaway PostgreSQL", `url="postgres://`, "cleanup job started",
		"shutting down", "cleanup job stopped", "stopping the throwaway PostgreSQL", "msg=stopped"} {
		i := strings.Index(out[at:], want)
		if i < 0 {
			t.Errorf("log lacks %q after offset %d:\n%s", want, at, out)
			continue
		}
		at += i + len(want)
	}
}
