package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsql"
)

// limitWords is a limit's exported fields, for comparing limits whatever
// the library keeps beside them.
func limitWords(ls []pglimit.Limit) string {
	var s []string
	for _, l := range ls {
		s = append(s, fmt.Sprintf("%s %d/%s burst %d debt %d %s %s %s", l.Name, l.Rate, l.Period, l.Burst, l.Debt, l.Algorithm, l.Calendar, l.TimeZone))
	}
	return strings.Join(s, "; ")
}

// waitRecorded waits until schema's recorded policies satisfy ok, which a
// limiter's first decision records on a goroutine of its own, and returns
// them. It gives up after 10 s, a bound far past one catalog read and one
// upsert on a loaded machine.
func waitRecorded(t *testing.T, db pglimit.DB, schema string, ok func([]pglimit.RecordedPolicy) bool) []pglimit.RecordedPolicy {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := pglimit.RecordedPolicies(context.Background(), db, schema)
		if err != nil {
			t.Fatal(err)
		}
		if ok(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("recorded policies after 10 s: %+v", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A limiter's first decision records its policy: namespace, strategy,
// limits in order with defaults filled in, per-key limits, table.
func TestRecordedPolicies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	if got, err := pglimit.RecordedPolicies(ctx, pool, schema); err != nil || len(got) != 0 {
		t.Fatalf("before any limiter: %+v, %v; want none", got, err)
	}
	cfg := pglimit.Config{Schema: schema, Namespace: "items", Overrides: true, Strategy: pglimit.NoWait, Limits: []pglimit.Limit{
		{Name: "per-minute", Rate: 5, Period: time.Minute, Burst: 3},
		{Name: "per-day", Rate: 20, Calendar: "day", Algorithm: pglimit.FixedWindow, TimeZone: "Europe/Paris"},
		pglimit.PerHour(100),
	}}
	lim, err := pglimit.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Allow(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	got := waitRecorded(t, pool, schema, func(r []pglimit.RecordedPolicy) bool { return len(r) > 0 })
	want := lim.Policy()
	if len(got) != 1 || !got[0].Latest || got[0].Table != "pglimit_nowait" || !got[0].Overrides || got[0].Namespace != "items" ||
		got[0].Strategy != pglimit.NoWait || limitWords(got[0].Limits) != limitWords(want.Limits) || got[0].Recorded.IsZero() {
		t.Errorf("recorded %+v; want %+v on pglimit_nowait with Overrides", got, want)
	}
	// database/sql's pool, through pglimitsql, records too.
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	viaSQL, err := pglimit.New(pglimitsql.DB(sqlDB), &pglimit.Config{Schema: schema, Namespace: "items-sql", Cooldown: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := viaSQL.Allow(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	waitRecorded(t, pool, schema, func(r []pglimit.RecordedPolicy) bool { return len(r) == 2 && r[1].Namespace == "items-sql" })
	if _, err := pglimit.RecordedPolicies(ctx, pool, "bad schema"); !errors.Is(err, pglimit.ErrInvalidConfig) {
		t.Errorf("RecordedPolicies of a bad schema name: %v; want ErrInvalidConfig", err)
	}
}

// A rolling deploy that changes a namespace's limits runs both versions on
// one row of the table: both keep deciding, and the table holds both
// policies, the one whose limiter started last as the latest.
func TestRecordedPoliciesRollingDeploy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	old := pglimit.Config{Schema: schema, Namespace: "export", Cooldown: 3 * time.Second}
	next := pglimit.Config{Schema: schema, Namespace: "export", Limits: []pglimit.Limit{{Name: "cooldown", Rate: 1, Period: time.Second, Burst: 2}}}
	start := func(cfg pglimit.Config) pglimit.Limiter {
		t.Helper()
		lim, err := pglimit.New(pool, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lim.Allow(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		return lim
	}
	latest := func(want pglimit.Limiter, previous pglimit.Limiter) func([]pglimit.RecordedPolicy) bool {
		return func(r []pglimit.RecordedPolicy) bool {
			return len(r) == 2 && r[0].Latest && limitWords(r[0].Limits) == limitWords(want.Policy().Limits) &&
				!r[1].Latest && limitWords(r[1].Limits) == limitWords(previous.Policy().Limits) && !r[1].Recorded.After(r[0].Recorded)
		}
	}
	a := start(old)
	waitRecorded(t, pool, schema, func(r []pglimit.RecordedPolicy) bool { return len(r) == 1 })
	b := start(next)
	waitRecorded(t, pool, schema, latest(b, a))
	for _, lim := range []pglimit.Limiter{a, b} {
		if _, err := lim.Allow(ctx, "other"); err != nil {
			t.Errorf("%s after the other version recorded: %v", limitWords(lim.Policy().Limits), err)
		}
	}
	// An instance of the old version restarts: its policy is the latest again.
	a2 := start(old)
	waitRecorded(t, pool, schema, latest(a2, b))
}

// In a schema migrated before limiters recorded their policies, a limiter
// decides as before, and RecordedPolicies says what is missing.
func TestRecordedPoliciesUnmigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	if _, err := pool.Exec(ctx, "DROP TABLE "+schema+".pglimit_policies"); err != nil {
		t.Fatal(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "old", Cooldown: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		if d, err := lim.Allow(ctx, "k"); err != nil || d.Allowed != want {
			t.Fatalf("Allow %d on a schema without pglimit_policies: %+v, %v; want allowed %v", i+1, d, err, want)
		}
	}
	_, err = pglimit.RecordedPolicies(ctx, pool, schema)
	if !errors.Is(err, pglimit.ErrInvalidConfig) || !strings.Contains(err.Error(), "pglimit_policies") || !strings.Contains(err.Error(), "Migrate") {
		t.Errorf("RecordedPolicies without the table: %v; want ErrInvalidConfig naming it and Migrate", err)
	}
}

// A limiter over one connection, which is not safe for concurrent use,
// records nothing: recording beside its decisions would use the connection
// at the same time as they do ("conn busy"). So does one over a
// transaction, which a failed statement would abort.
func TestRecordedPoliciesNotOverAConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, db := range []pglimit.DB{conn.Conn(), tx} {
		lim, err := pglimit.New(db, &pglimit.Config{Schema: schema, Namespace: fmt.Sprintf("%T", db), Limits: []pglimit.Limit{pglimit.PerMinute(1000)}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 50 {
			if _, err := lim.Allow(ctx, fmt.Sprint("k", i)); err != nil {
				t.Fatalf("Allow %d over %T: %v", i+1, db, err)
			}
		}
	}
}

// A limiter whose first record failed for a reason that may pass (here, a
// schema not migrated yet) tries again at a later decision, and records
// once it can.
func TestRecordedPoliciesRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, migrated := testdb.Pool(t), testdb.Schema(t), testdb.Schema(t)
	if _, err := pool.Exec(ctx, "DROP TABLE "+schema+".pglimit_policies"); err != nil {
		t.Fatal(err)
	}
	cfg := pglimit.Config{Schema: schema, Namespace: "late", Cooldown: time.Minute}
	pglimit.SetRecordRetry(&cfg, 10*time.Millisecond)
	lim, err := pglimit.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Allow(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	// The migration arrives after the limiter's first decision.
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".pglimit_policies (LIKE "+migrated+".pglimit_policies INCLUDING ALL)"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := lim.Peek(ctx, "k", 1); err != nil {
			t.Fatal(err)
		}
		got, err := pglimit.RecordedPolicies(ctx, pool, schema)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 1 && got[0].Namespace == "late" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s of decisions, recorded %+v; want the limiter's policy", got)
		}
	}
}
