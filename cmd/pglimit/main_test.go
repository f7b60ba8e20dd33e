package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimithealth"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
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
	record(t, pool, lim, schema)
	return &bundle{pool: pool, cfg: cfg, lim: lim, env: map[string]string{
		"DATABASE_URL":      testdb.URL(t),
		"PGLIMIT_SCHEMA":    schema,
		"PGLIMIT_NAMESPACE": "items",
		"PGLIMIT_OVERRIDES": "true",
		"PGLIMIT_LIMITS":    "per-minute=5/1m,burst=3; per-day=20/day,tz=Europe/Paris",
	}}
}

// record has lim record its policy, as its first decision does (Peek, which
// consumes nothing), and waits until schema holds it: the record is
// written on a goroutine of its own. It gives up after 10 s, far past one
// catalog read and one upsert on a loaded machine.
func record(t *testing.T, pool *pgxpool.Pool, lim pglimit.Limiter, schema string) {
	t.Helper()
	ctx := context.Background()
	if _, err := lim.Peek(ctx, "record-policy", 1); err != nil {
		t.Fatal(err)
	}
	want := lim.Policy()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		recs, err := pglimit.RecordedPolicies(ctx, pool, schema)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(recs, func(r pglimit.RecordedPolicy) bool {
			return r.Latest && r.Namespace == want.Namespace && words(r.Limits) == words(want.Limits)
		}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s not recorded after 10 s: %+v", want.Namespace, recs)
		}
	}
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
	if own, err := pglimit.ListKeyLimits(ctx, testdb.Limiter(t, b.pool, &b.cfg), "", 10); err != nil || len(own) != 0 {
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
	own, err := pglimit.ListKeyLimits(ctx, testdb.Limiter(t, b.pool, &b.cfg), "", 10)
	if err != nil || len(own) != 1 || own[0].Expires.Sub(own[0].Updated) != time.Hour {
		t.Errorf("ListKeyLimits after overrides set -for 1h: %+v, %v", own, err)
	}

	if code, out, errOut := b.pglimit(t, "overrides", "clear", "bob"); code != 0 {
		t.Fatalf("overrides clear: exit %d, %s%s", code, out, errOut)
	}
	if own, err := pglimit.ListKeyLimits(ctx, testdb.Limiter(t, b.pool, &b.cfg), "", 10); err != nil || len(own) != 0 {
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
	if st, err := pglimit.Inspect(ctx, testdb.Limiter(t, b.pool, &b.cfg), "carol"); err != nil || st.Limits[0].Remaining != 0 {
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
	if own, err := pglimit.ListKeyLimits(context.Background(), testdb.Limiter(t, b.pool, &b.cfg), "", 10); err != nil || len(own) != 0 {
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

// A misspelt schema is bad input, exit status 2, with a message naming the
// table, as the library's ErrInvalidConfig says it: not status 1 and a
// bare SQLSTATE that reads like an outage.
func TestMisspeltSchemaCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.use(t, "a", 1)
	b.env["PGLIMIT_SCHEMA"] += "x"
	for _, args := range [][]string{{"inspect", "a"}, {"limited"}, {"overrides", "list"}} {
		code, out, errOut := b.pglimit(t, args...)
		if code != 2 || !strings.Contains(errOut, "invalid config") || !strings.Contains(errOut, b.env["PGLIMIT_SCHEMA"]) {
			t.Errorf("pglimit %q with a misspelt schema: exit %d, %s%s; want 2 and ErrInvalidConfig naming %s", args, code, out, errOut, b.env["PGLIMIT_SCHEMA"])
		}
	}
}

// The command believed whatever limiter it was described, and exited 0:
// each case below read a key its 3 s cooldown refuses as another limiter's
// state. Each is refused now, naming the difference, and with no
// description the command uses the one the limiter recorded.
func TestDescriptionMustMatchRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema, pool := testdb.Schema(t), testdb.Pool(t)
	cfg := pglimit.Config{Schema: schema, Namespace: "partner-export", Overrides: true, Limits: []pglimit.Limit{
		{Name: "cooldown", Rate: 1, Period: 3 * time.Second, Burst: 2},
		{Name: "daily", Rate: 100, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
	}}
	lim, err := pglimit.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	record(t, pool, lim, schema)
	for _, ns := range []string{"billing", "partner-import"} {
		other, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: ns, Cooldown: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		record(t, pool, other, schema)
	}
	// The key's own burst is 1: one request, and the cooldown refuses it.
	if err := pglimit.SetKeyLimits(ctx, lim, "k", pglimit.Limit{Name: "cooldown", Burst: 1}); err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("Allow: %+v, %v", d, err)
	}
	b := &bundle{env: map[string]string{"DATABASE_URL": testdb.URL(t), "PGLIMIT_SCHEMA": schema}}
	limits := []string{"-limit", "cooldown=1/3s,burst=2", "-limit", "daily=100/24h,fixed"}
	for _, tc := range []struct {
		name string
		args []string
		want string // in the message
	}{
		{"namespace typo", append([]string{"-namespace", "partner-exprot", "-overrides"}, limits...),
			`namespace "partner-exprot" has no recorded policy in schema "` + schema + `" (a limiter records its own at its first decision); namespaces recorded, closest first: partner-export, partner-import, billing`},
		{"wrong period", []string{"-namespace", "partner-export", "-overrides", "-limit", "cooldown=1/1h,burst=2", "-limit", "daily=100/24h,fixed"},
			"limit 1: described cooldown=1/1h0m0s,burst=2, recorded cooldown=1/3s,burst=2"},
		{"limits in reverse order", []string{"-namespace", "partner-export", "-overrides", "-limit", "daily=100/24h,fixed", "-limit", "cooldown=1/3s,burst=2"},
			"limit 1: described daily=100/24h0m0s,fixed, recorded cooldown=1/3s,burst=2; limit 2: described cooldown=1/3s,burst=2, recorded daily=100/24h0m0s,fixed"},
		{"forgotten -overrides", append([]string{"-namespace", "partner-export"}, limits...),
			"per-key limits: the limiter reads them, the description does not (pass -overrides"},
		{"no namespace, several recorded", []string{}, "no namespace given"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := b.pglimit(t, append(tc.args, "inspect", "k")...)
			if code != 2 || !strings.Contains(errOut, tc.want) {
				t.Errorf("pglimit %q inspect k: exit %d, stdout:\n%sstderr: %s\nwant exit 2 and a message with %q", tc.args, code, out, errOut, tc.want)
			}
		})
	}
	t.Run("the recorded policy", func(t *testing.T) {
		code, out, errOut := b.pglimit(t, "-namespace", "partner-export", "inspect", "k")
		if code != 0 || errOut != "" || !strings.Contains(out, "refused now: a request of 1 unit may pass in") || !strings.Contains(out, "own limits: cooldown burst 1") {
			t.Errorf("pglimit -namespace partner-export inspect k: exit %d, stdout:\n%sstderr: %s\nwant k refused under its own burst of 1", code, out, errOut)
		}
		code, out, errOut = b.pglimit(t, append(append([]string{"-namespace", "partner-export", "-overrides"}, limits...), "inspect", "k")...)
		if code != 0 || errOut != "" || !strings.Contains(out, "refused now: a request of 1 unit may pass in") {
			t.Errorf("pglimit with the right description: exit %d, stdout:\n%sstderr: %s", code, out, errOut)
		}
	})
}

// In a schema migrated before limiters recorded their policies the command
// takes the description as given, and says that it could not check it;
// with no description it says what is missing.
func TestUnrecordedSchemaCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.use(t, "a", 3)
	if _, err := b.pool.Exec(context.Background(), "DROP TABLE "+b.cfg.Schema+".pglimit_policies"); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := b.pglimit(t, "inspect", "a")
	if code != 0 || !strings.Contains(errOut, "warning: the limiter described is not checked") || !strings.Contains(out, "refused now: a request of 1 unit") {
		t.Errorf("inspect on a schema without pglimit_policies: exit %d, %s%s; want the described limiter's answer and a warning", code, out, errOut)
	}
	b.env["PGLIMIT_LIMITS"] = ""
	code, out, errOut = b.pglimit(t, "inspect", "a")
	if code != 2 || !strings.Contains(errOut, `pglimit_policies" does not exist`) || !strings.Contains(errOut, "Migrate") {
		t.Errorf("inspect with no description on a schema without pglimit_policies: exit %d, %s%s; want 2, the table and Migrate", code, out, errOut)
	}
}

// During a rolling deploy that changes a namespace's limits, both versions'
// policies are recorded: the command uses the latest and names the one
// before it, and a description of the one before it is taken, with a
// warning.
func TestRollingDeployCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	next := b.cfg
	next.Limits = []pglimit.Limit{{Name: "per-minute", Rate: 10, Period: time.Minute, Burst: 3}, b.cfg.Limits[1]}
	lim, err := pglimit.New(b.pool, &next)
	if err != nil {
		t.Fatal(err)
	}
	record(t, b.pool, lim, b.cfg.Schema)

	code, out, errOut := b.pglimit(t, "inspect", "a") // the environment describes the version before
	if code != 0 || !strings.Contains(errOut, `warning: the limiter described is namespace "items"'s policy before the latest`) ||
		!strings.Contains(errOut, "limit 1: described per-minute=5/1m0s,burst=3, recorded per-minute=10/1m0s,burst=3") || !strings.Contains(out, "5 per 1m0s") {
		t.Errorf("inspect described as the version before: exit %d, %s%s; want it, and a warning naming the difference", code, out, errOut)
	}
	b.env["PGLIMIT_LIMITS"] = ""
	code, out, errOut = b.pglimit(t, "inspect", "a")
	if code != 0 || !strings.Contains(out, "10 per 1m0s") || !strings.Contains(errOut, "note: namespace \"items\" recorded another policy before the latest") ||
		!strings.Contains(errOut, "per-minute=5/1m0s,burst=3") {
		t.Errorf("inspect with no description: exit %d, %s%s; want the latest, and a note naming the one before", code, out, errOut)
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

// A standby that could not be read counts as infinitely behind: the table
// shows +Inf, and -json, which has no infinity, a null value.
func TestHealthUnreadStandby(t *testing.T) {
	st := []pglimithealth.State{{
		Name: "backfills", Rate: 1, Over: true, Signal: pglimithealth.StandbyReplayDelay,
		Value: math.Inf(1), Threshold: 5, Samples: 3, Leader: "worker-1",
	}}
	var table, js bytes.Buffer
	if err := (printer{w: &table}).health("", st); err != nil || !strings.Contains(table.String(), "standby_replay_delay +Inf > 5") {
		t.Errorf("table: %v\n%s", err, table.String())
	}
	if err := (printer{w: &js, json: true}).health("", st); err != nil {
		t.Fatalf("-json of an infinite value: %v", err)
	}
	var got []map[string]any
	if err := json.Unmarshal(js.Bytes(), &got); err != nil || len(got) != 1 || got[0]["value"] != nil || got[0]["signal"] != "standby_replay_delay" {
		t.Errorf("-json: %v, %s; want the signal with a null value", err, js.String())
	}
}

// billed makes the quota "billing" (an allowance of 10, a hard cap of
// 15), on which key "acme" holds a credit of 4 and has been charged 13,
// under allow's context, and points the command at it.
func billed(t *testing.T, b *bundle, allow context.Context) *pglimitquota.Quota {
	t.Helper()
	q, err := pglimitquota.New(b.pool, &pglimitquota.Config{Schema: b.cfg.Schema, Namespace: "billing", Allowance: 10, HardCap: 15})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Grant(context.Background(), "acme", 4, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if d, err := q.Allow(allow, "acme", 13); err != nil || !d.Allowed {
		t.Fatalf("Allow: %+v, %v", d, err)
	}
	b.env["PGLIMIT_NAMESPACE"] = "billing"
	return q
}

// usage shows a key's billing period: used, allowance, credits left,
// overage and the period's end.
func TestUsageCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	billed(t, b, context.Background())
	code, out, errOut := b.pglimit(t, "usage", "-allowance", "10", "-hard-cap", "15", "acme")
	if code != 0 || !strings.Contains(out, "used 13: 10 of the allowance of 10, 3 from credits, 0 overage (hard cap 15)") || !strings.Contains(out, "credits left 1") {
		t.Fatalf("usage acme: exit %d, %s%s", code, out, errOut)
	}
	t.Logf("pglimit usage acme:\n%s", out)
	code, out, errOut = b.pglimit(t, "-json", "usage", "acme")
	var got struct {
		Used        int64     `json:"used"`
		CreditsLeft int64     `json:"credits_left"`
		PeriodEnd   time.Time `json:"period_end"`
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || got.Used != 13 || got.CreditsLeft != 1 || got.PeriodEnd.IsZero() {
		t.Fatalf("-json usage: exit %d, %s%s (%v)", code, out, errOut, err)
	}
	for _, args := range [][]string{{"usage"}, {"usage", "a", "b"}, {"usage", "-tz", "Mars/Olympus_Mons", "a"}, {"usage", "-allowance", "-1", "a"}} {
		if code, out, errOut := b.pglimit(t, args...); code != 2 {
			t.Errorf("%q: exit %d, %s%s; want 2", args, code, out, errOut)
		}
	}
}

// forget deletes a key's billing state and prints its period before;
// -dry-run shows it without doing it; a bad key is exit status 2.
func TestForgetCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	q := billed(t, b, pglimit.WithID(ctx, "order-1"))
	used := func() int64 {
		t.Helper()
		u, err := q.Usage(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		return u.Used
	}
	code, out, errOut := b.pglimit(t, "forget", "-dry-run", "-allowance", "10", "-hard-cap", "15", "acme")
	if code != 0 || !strings.Contains(out, "dry run: would have forgotten \"acme\"") || !strings.Contains(out, "used 13: 10 of the allowance of 10, 3 from credits") {
		t.Fatalf("forget -dry-run acme: exit %d, %s%s", code, out, errOut)
	}
	if u := used(); u != 13 {
		t.Fatalf("after forget -dry-run the key used %d, want 13: nothing changed", u)
	}
	code, out, errOut = b.pglimit(t, "-json", "forget", "acme")
	var got struct {
		Command string `json:"command"`
		DryRun  bool   `json:"dry_run"`
		Before  struct {
			Used int64 `json:"used"`
		} `json:"before"`
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || got.Command != "forget" || got.DryRun || got.Before.Used != 13 {
		t.Fatalf("-json forget acme: exit %d, %s%s (%v)", code, out, errOut, err)
	}
	t.Logf("pglimit -json forget acme:\n%s", out)
	if u := used(); u != 0 {
		t.Fatalf("after forget the key used %d, want 0", u)
	}
	if _, err := q.RefundID(ctx, "order-1", 1); !errors.Is(err, pglimit.ErrNotAdmitted) {
		t.Fatalf("RefundID of the forgotten key's id: %v, want ErrNotAdmitted", err)
	}
	for _, args := range [][]string{{"forget"}, {"forget", "a", "b"}, {"forget", "a\x00"}} {
		if code, out, errOut := b.pglimit(t, args...); code != 2 {
			t.Errorf("%q: exit %d, %s%s; want 2", args, code, out, errOut)
		}
	}
}
