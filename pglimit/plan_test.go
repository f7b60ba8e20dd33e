package pglimit_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// A statement's plan is cached on each connection, and after five runs it
// may be the generic plan, made once for any parameters. On a table created
// empty and never analysed (every fresh install), a generic plan that
// scans the namespace looks cheap, and it stays cached while the table
// grows: each decision then reads every key of the namespace. Every
// statement a limiter prepares must instead reach each of its keys through
// the primary key (or a ctid it read through it), whatever the plan cache
// chose and however the table grew after. The test plans each statement on
// the empty table, grows the table to rowsAfter keys, and counts the rows
// the cached plan touches in it, with its keys fitting so that every part
// of every statement runs.
func TestPlansReachKeysByIndex(t *testing.T) {
	t.Parallel()
	const rowsAfter = 20_000
	keys := []string{"k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8"}
	// One GCRA limit, whose statements are the cheapest; two limits,
	// which the general statements decide; and the same with per-key
	// limits, which they read from the overrides table.
	two := []pglimit.Limit{{Name: "second", Rate: 10, Period: time.Second, Burst: 5}, {Name: "day", Rate: 1000, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow}}
	sets := map[string]pglimit.Config{
		"one": {Limits: []pglimit.Limit{{Rate: 10, Period: time.Second, Burst: 5}}},
		"two": {Limits: two},
		"own": {Limits: two, Overrides: true, Namespace: "default"},
	}
	for _, mode := range []string{"force_generic_plan", "auto"} {
		for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
			for set, cfg := range sets {
				t.Run(mode+"/"+string(s)+"/"+set, func(t *testing.T) {
					t.Parallel()
					planReachesKeysByIndex(t, s, cfg, mode, keys, rowsAfter)
				})
			}
		}
	}
}

// planReachesKeysByIndex is TestPlansReachKeysByIndex for the statements
// of one limiter of cfg on s, planned in mode.
func planReachesKeysByIndex(t *testing.T, s pglimit.Strategy, cfg pglimit.Config, mode string, keys []string, rowsAfter int) {
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	cfg.Strategy, cfg.Schema = s, schema
	lim, err := pglimit.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{schema, "pglimit_" + string(s)}.Sanitize()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, "RESET plan_cache_mode; DEALLOCATE ALL") //nolint:errcheck // the pool closes the connection at the end

	stmts := pglimit.Statements(lim)
	args := planArgs(keys)
	for name, sql := range stmts {
		if _, err := conn.Exec(ctx, fmt.Sprintf("PREPARE %s AS %s", name, sql)); err != nil {
			t.Fatalf("prepare %s: %v", name, err)
		}
		// Six runs on the small table: from the sixth the plan
		// cache may keep a generic plan.
		for range 6 {
			if _, err := conn.Exec(ctx, fmt.Sprintf("EXECUTE %s(%s)", name, args[name])); err != nil {
				t.Fatalf("execute %s: %v", name, err)
			}
		}
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(
		`INSERT INTO %s (namespace, key, expires_at) SELECT 'default', 'g' || i, now() - interval '1 hour'
		 FROM generate_series(1, %d) AS i`, table, rowsAfter)); err != nil {
		t.Fatal(err)
	}
	tables := []string{"pglimit_" + string(s)}
	if cfg.Overrides {
		// The keys' own limits are read by primary key too.
		if _, err := conn.Exec(ctx, fmt.Sprintf(
			`INSERT INTO %s (namespace, key, limits) SELECT 'default', 'g' || i, '{"second": {"rate": 20}}'
			 FROM generate_series(1, %d) AS i`, pgx.Identifier{schema, "pglimit_overrides"}.Sanitize(), rowsAfter)); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, "pglimit_overrides")
	}
	for name := range stmts {
		// Every key fits again, so that the parts that lock and write run:
		// a part that never runs touches no row.
		if _, err := conn.Exec(ctx, fmt.Sprintf(
			`UPDATE %s SET expires_at = now() - interval '1 hour', state = NULL WHERE key LIKE 'k%%'`, table)); err != nil {
			t.Fatal(err)
		}
		var plan []struct{ Plan planNode }
		if err := conn.QueryRow(ctx, fmt.Sprintf("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE %s(%s)", name, args[name])).Scan(&plan); err != nil {
			t.Fatalf("explain %s: %v", name, err)
		}
		for _, table := range tables {
			touched := plan[0].Plan.touched(table)
			t.Logf("%s: %d rows of %s touched", name, touched, table)
			if limit := 4 * len(keys); touched > limit {
				t.Errorf("%s: the cached plan touched %d rows of %s, of %d rows, for %d keys (at most %d expected):\n%s",
					name, touched, table, rowsAfter, len(keys), limit, plan[0].Plan)
			}
		}
	}
}

// planArgs are the literal arguments of each statement of Statements.
func planArgs(keys []string) map[string]string {
	n := len(keys)
	repeat := func(v string) string { return "'{" + strings.TrimSuffix(strings.Repeat(v+",", n), ",") + "}'" }
	return map[string]string{
		"allow":            "'default', 'k1', 100000, 7, 400000",
		"general":          "'default', 'k1', 7, 1",
		"peek":             "'default', 'k1'",
		"inspect":          "'default', 'k1'",
		"hierarchy":        "'default', 'k1', 'default', 'k2', 1",
		"reset":            "'default', 'g1', 7", // a key of the grown table: the others stay
		"batchwait":        "'default', '{k1}', '{100000}', 7, '{400000}', '{2}', '{1}', '{1000}', 100000, 500000, 0",
		"generalbatch":     fmt.Sprintf("'default', '{%s}', %s, 7, %s", strings.Join(keys, ","), repeat("1"), repeat("2")),
		"generalbatchwait": "'default', '{k1}', '{1}', 7, '{2}'",
		"giveback":         "'default', 'k1', 100000, 0, 0",
		"batch": fmt.Sprintf("'default', '{%s}', %s, 7, %s, %s, %s, %s, 100000, 500000, 0", strings.Join(keys, ","),
			repeat("100000"), repeat("400000"), repeat("2"), repeat("1"), repeat("1000")),
	}
}

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON).
type planNode struct {
	NodeType      string     `json:"Node Type"`
	Relation      string     `json:"Relation Name"`
	Rows          float64    `json:"Actual Rows"`
	Loops         float64    `json:"Actual Loops"`
	RemovedFilter float64    `json:"Rows Removed by Filter"`
	RemovedCheck  float64    `json:"Rows Removed by Index Recheck"`
	Plans         []planNode `json:"Plans"`
}

// touched is how many rows of table the scans under p read: those they
// returned and those their filters removed, over all their loops.
func (p planNode) touched(table string) int {
	n := 0.0
	if p.Relation == table && strings.Contains(p.NodeType, "Scan") {
		n = (p.Rows + p.RemovedFilter + p.RemovedCheck) * p.Loops
	}
	for _, c := range p.Plans {
		n += float64(c.touched(table))
	}
	return int(n)
}

func (p planNode) String() string {
	var b strings.Builder
	var walk func(p planNode, depth int)
	walk = func(p planNode, depth int) {
		fmt.Fprintf(&b, "%s%s %s rows=%g removed=%g loops=%g\n", strings.Repeat("  ", depth), p.NodeType, p.Relation,
			p.Rows, p.RemovedFilter+p.RemovedCheck, p.Loops)
		for _, c := range p.Plans {
			walk(c, depth+1)
		}
	}
	walk(p, 0)
	return b.String()
}
