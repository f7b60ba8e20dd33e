package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithealth"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// bundle is a migrated schema with a limiter of two limits and per-key
// limits, as an application would run it, and the environment that
// describes it to the command.
type bundle struct {
	pool *pgxpool.Pool
	cfg  pglimit.Config
	lim  pglimit.Limiter
	env  map[string]string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	cfg := pglimit.Config{Schema: schema, Namespace: "items", Overrides: true, Limits: []pglimit.Limit{
		{Name: "per-minute", Rate: 5, Period: time.Minute, Burst: 3},
		{Name: "per-day", Rate: 20, Calendar: "day", Algorithm: pglimit.FixedWindow, TimeZone: "Europe/Paris"},
	}}
	lim, err := pglimit.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{pool: pool, cfg: cfg, lim: lim, env: map[string]string{
		"DATABASE_URL":      testdb.URL(t),
		"PGLIMIT_SCHEMA":    schema,
		"PGLIMIT_NAMESPACE": "items",
		"PGLIMIT_OVERRIDES": "true",
		"PGLIMIT_LIMITS":    "per-minute=5/1m,burst=3; per-day=20/day,tz=Europe/Paris",
	}}
}

// pglimit runs the command with args, and returns its exit status and
// output.
func (b *bundle) pglimit(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, func(k string) string { return b.env[k] }, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// use admits n requests of key, all of which must pass.
func (b *bundle) use(t *testing.T, key string, n int) {
	t.Helper()
	for range n {
		if d, err := b.lim.Allow(context.Background(), key); err != nil || !d.Allowed {
			t.Fatalf("Allow(%s): %+v, %v", key, d, err)
		}
	}
}

// The person on call sees why a key is refused and until when, in a table
// and in JSON, as the library's Inspect reads it.
func TestInspectCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.use(t, "alice", 3)

	code, out, errOut := b.pglimit(t, "inspect", "alice")
	if code != 0 {
		t.Fatalf("inspect alice: exit %d, %s", code, errOut)
	}
	for _, want := range []string{`key "alice" of namespace "items"`, "per-minute  5 per 1m0s, burst 3", "per-day     20 per day (Europe/Paris)  17",
		"refused now: a request of 1 unit may pass in 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect alice printed:\n%s\nwant a line with %q", out, want)
		}
	}

	code, out, errOut = b.pglimit(t, "inspect", "-json", "alice")
	if code != 0 {
		t.Fatalf("inspect -json alice: exit %d, %s", code, errOut)
	}
	var st jsonState
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("inspect -json printed %q: %v", out, err)
	}
	if !st.Refused || st.Key != "alice" || len(st.Limits) != 2 || st.Limits[0].Remaining != 0 ||
		st.Limits[0].RetryAfterMS < 11_000 || st.Limits[0].RetryAfterMS > 12_000 || st.Limits[1].Remaining != 17 || st.Limits[1].WindowEnd == nil {
		t.Errorf("inspect -json alice: %+v; want refused for up to 12 s (one unit every 12 s), 17 left today", st)
	}
}

// Own limits for an hour take effect on the next decision and show in the
// list; -dry-run writes nothing; clear takes them away.
func TestOverridesCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.use(t, "bob", 3)

	code, out, errOut := b.pglimit(t, "-dry-run", "overrides", "set", "-for", "1h", "bob", "per-minute=/10")
	if code != 0 || !strings.Contains(out, "dry run: would have set own limits of \"bob\"") || !strings.Contains(out, "burst 10") {
		t.Fatalf("a dry run of overrides set: exit %d, %s%s", code, out, errOut)
	}
	if own, err := pglimit.ListKeyLimits(ctx, b.pool, &b.cfg, "", 10); err != nil || len(own) != 0 {
		t.Fatalf("after the dry run: %+v, %v; want nothing written", own, err)
	}
	if d, err := b.lim.Allow(ctx, "bob"); err != nil || d.Allowed {
		t.Fatalf("after the dry run: %+v, %v; want bob still refused", d, err)
	}

	code, out, errOut = b.pglimit(t, "overrides", "set", "-for", "1h", "bob", "per-minute=/10")
	if code != 0 || !strings.Contains(out, "per-minute burst 10, until ") {
		t.Fatalf("overrides set: exit %d, %s%s", code, out, errOut)
	}
	if d, err := b.lim.Allow(ctx, "bob"); err != nil || !d.Allowed || d.Limit.Burst != 10 && d.Limit.Name == "per-minute" {
		t.Errorf("after overrides set: %+v, %v; want bob admitted under his burst of 10", d, err)
	}
	code, out, _ = b.pglimit(t, "overrides", "list")
	if code != 0 || !strings.Contains(out, "bob") || !strings.Contains(out, "until") {
		t.Errorf("overrides list: exit %d, %s", code, out)
	}
	own, err := pglimit.ListKeyLimits(ctx, b.pool, &b.cfg, "", 10)
	if err != nil || len(own) != 1 || own[0].Expires.Sub(own[0].Updated) != time.Hour {
		t.Errorf("ListKeyLimits after overrides set -for 1h: %+v, %v", own, err)
	}

	if code, out, errOut := b.pglimit(t, "overrides", "clear", "bob"); code != 0 {
		t.Fatalf("overrides clear: exit %d, %s%s", code, out, errOut)
	}
	if own, err := pglimit.ListKeyLimits(ctx, b.pool, &b.cfg, "", 10); err != nil || len(own) != 0 {
		t.Errorf("after overrides clear: %+v, %v", own, err)
	}
}

// reset puts a key back to full, and -dry-run shows it without doing it.
func TestResetCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.use(t, "carol", 3)
	code, out, _ := b.pglimit(t, "reset", "-dry-run", "carol")
	if code != 0 || !strings.Contains(out, "rolled back, nothing changed") {
		t.Fatalf("reset -dry-run: exit %d, %s", code, out)
	}
	code, out, _ = b.pglimit(t, "reset", "-dry-run", "-json", "carol")
	var done struct {
		DryRun bool      `json:"dry_run"`
		State  jsonState `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &done); code != 0 || err != nil || !done.DryRun || done.State.Limits[0].Remaining != 3 {
		t.Fatalf("reset -dry-run -json: exit %d, %v, %s; want the full burst it would leave", code, err, out)
	}
	if st, err := pglimit.Inspect(ctx, b.pool, &b.cfg, "carol"); err != nil || st.Limits[0].Remaining != 0 {
		t.Fatalf("after the dry run: %+v, %v; want carol still at her burst", st, err)
	}
	if code, out, errOut := b.pglimit(t, "reset", "carol"); code != 0 {
		t.Fatalf("reset: exit %d, %s%s", code, out, errOut)
	}
	if d, err := b.lim.Allow(ctx, "carol"); err != nil || !d.Allowed || d.Remaining != 2 {
		t.Errorf("after reset: %+v, %v; want a full burst again", d, err)
	}
}

// limited lists the keys at their limit, page by page.
func TestLimitedCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.use(t, "a", 3)
	b.use(t, "b", 1)
	b.use(t, "c", 3)
	code, out, _ := b.pglimit(t, "limited", "-json")
	var page struct {
		Keys []jsonState `json:"keys"`
	}
	if err := json.Unmarshal([]byte(out), &page); code != 0 || err != nil || len(page.Keys) != 2 || page.Keys[0].Key != "a" || page.Keys[1].Key != "c" {
		t.Fatalf("limited -json: exit %d, %v, %s; want a and c", code, err, out)
	}
	code, out, _ = b.pglimit(t, "limited", "-max", "1")
	if code != 0 || !strings.Contains(out, "a  ") || strings.Contains(out, "c  ") || !strings.Contains(out, `-after "a" for the next page`) {
		t.Errorf("limited -max 1: exit %d, %s", code, out)
	}
	code, out, _ = b.pglimit(t, "limited", "-n", "3")
	if code != 0 || !strings.Contains(out, "b  ") {
		t.Errorf("limited -n 3 (fewer than 3 left): exit %d, %s; want b too", code, out)
	}
}

// cleaner names the leader and each table's backlog.
func TestCleanerCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	code, out, errOut := b.pglimit(t, "cleaner", "-tables", "pglimit_upsert,pglimit_slots")
	if code != 0 || !strings.Contains(out, "leader: none") || !strings.Contains(out, "pglimit_upsert") || !strings.Contains(out, "pglimit_slots") {
		t.Fatalf("cleaner: exit %d, %s%s", code, out, errOut)
	}
}

// Bad input is refused with exit status 2 and a message, and writes
// nothing; a database that cannot be reached is status 1.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, args := range [][]string{
		{},
		{"nope"},
		{"inspect"},
		{"inspect", ""},
		{"inspect", "a", "b"},
		{"inspect", "a\x00b"},
		{"-limit", "5", "inspect", "a"},
		{"-limit", "x/1m", "inspect", "a"},
		{"-limit", "5/1fortnight", "inspect", "a"},
		{"-limit", "5/1m,burst=-3", "inspect", "a"},
		{"-limit", "5/day,tz=Mars/Olympus", "inspect", "a"},
		{"-strategy", "redis", "inspect", "a"},
		{"-schema", "bad schema", "inspect", "a"},
		{"limited", "-n", "0"},
		{"limited", "-n", "4"},
		{"limited", "-max", "100000"},
		{"limited", "extra"},
		{"overrides"},
		{"overrides", "set", "bob"},
		{"overrides", "set", "bob", "per-hour=5"},
		{"overrides", "set", "bob", "per-minute=0"},
		{"overrides", "set", "bob", "per-minute=x"},
		{"overrides", "set", "-for", "-1h", "bob", "per-minute=10"},
		{"overrides", "set", "bob", "per-minute=10/1000000000"},
		{"cleaner", "-tables", "pglimit_upsert;drop"},
	} {
		code, out, errOut := b.pglimit(t, args...)
		if code != 2 || errOut == "" {
			t.Errorf("pglimit %q: exit %d, stdout %q, stderr %q; want 2 and a message", args, code, out, errOut)
		}
	}
	if own, err := pglimit.ListKeyLimits(context.Background(), b.pool, &b.cfg, "", 10); err != nil || len(own) != 0 {
		t.Errorf("after bad input: %+v, %v; want nothing written", own, err)
	}

	// The overrides commands without -overrides say which flag to pass.
	b.env["PGLIMIT_OVERRIDES"] = ""
	for _, args := range [][]string{{"overrides", "set", "bob", "per-minute=10"}, {"overrides", "list"}, {"overrides", "clear", "bob"}} {
		if code, _, errOut := b.pglimit(t, args...); code != 2 || !strings.Contains(errOut, "pass -overrides") {
			t.Errorf("pglimit %q without -overrides: exit %d, %q; want 2 and the flag to pass", args, code, errOut)
		}
	}
	b.env["PGLIMIT_OVERRIDES"] = "true"

	// A port nothing listens on: one just closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	b.env["DATABASE_URL"] = fmt.Sprintf("postgres://nobody@%s/x?connect_timeout=2", ln.Addr())
	if code, _, errOut := b.pglimit(t, "inspect", "a"); code != 1 || !strings.Contains(errOut, "unavailable") {
		t.Errorf("with no server: exit %d, %q; want 1 and ErrUnavailable's message", code, errOut)
	}
	b.env["DATABASE_URL"] = ""
	if code, _, errOut := b.pglimit(t, "inspect", "a"); code != 2 || !strings.Contains(errOut, "DATABASE_URL") {
		t.Errorf("with no URL: exit %d, %q; want 2 and how to give one", code, errOut)
	}
}

// health shows each throttle's rate and why, as its leader wrote them.
func TestHealthCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if code, out, errOut := b.pglimit(t, "health"); code != 0 || !strings.Contains(out, "no health throttle") {
		t.Fatalf("health before any throttle: exit %d, %s%s", code, out, errOut)
	}
	sampled := make(chan pglimithealth.State, 1)
	th, err := pglimithealth.New(b.pool, &pglimithealth.Config{
		Name: "backfills", Limiter: &b.cfg, Key: "backfill", Limit: "per-minute",
		Signals: []pglimithealth.Signal{{Kind: pglimithealth.LockWaiters, Threshold: 1000}},
		Floor:   1, Ceiling: 60, Increase: 5, Decrease: 0.5, Period: 50 * time.Millisecond, ID: "worker-1",
		OnSample: func(s pglimithealth.State) {
			select {
			case sampled <- s:
			default:
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := th.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sampled:
	case <-time.After(time.Minute):
		t.Fatal("no sample within a minute")
	}
	if err := th.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := b.pglimit(t, "health", "backfills")
	if code != 0 || !strings.Contains(out, "backfills") || !strings.Contains(out, "lock_waiters") ||
		!strings.Contains(out, "<= 1000") || !strings.Contains(out, "worker-1") {
		t.Fatalf("health backfills: exit %d, %s%s", code, out, errOut)
	}
	t.Logf("pglimit health backfills:\n%s", out)
	code, out, errOut = b.pglimit(t, "-json", "health")
	var got []struct {
		Name   string `json:"name"`
		Rate   int64  `json:"rate"`
		Signal string `json:"signal"`
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got) != 1 || got[0].Rate != 60 || got[0].Signal != "lock_waiters" {
		t.Fatalf("-json health: exit %d, %s%s (%v)", code, out, errOut, err)
	}
	if code, out, errOut := b.pglimit(t, "health", "a", "b"); code != 2 {
		t.Errorf("health with two names: exit %d, %s%s; want 2", code, out, errOut)
	}
}
