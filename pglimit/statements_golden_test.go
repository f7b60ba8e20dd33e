package pglimit

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var updateGolden = flag.Bool("update-statements", false, "rewrite testdata/statements.golden")

// nopDB is a DB that is never called: New only builds statements.
type nopDB struct{}

func (nopDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, fmt.Errorf("nopDB")
}
func (nopDB) QueryRow(context.Context, string, ...any) pgx.Row { return nil }

// The statements of decisions without an id are byte for byte what
// testdata/statements.golden holds: ids (WithID) add statements, and
// change none of those a limiter that uses none of them sends.
func TestStatementsGolden(t *testing.T) {
	t.Parallel()
	configs := []struct {
		name string
		cfg  Config
	}{
		{"upsert-single", Config{Strategy: Upsert, Limits: []Limit{{Name: "a", Rate: 10, Period: time.Second, Burst: 10}}}},
		{"nowait-single", Config{Strategy: NoWait, Limits: []Limit{{Name: "a", Rate: 10, Period: time.Second, Burst: 10}}}},
		{"upsert-general", Config{Strategy: Upsert, Limits: []Limit{{Name: "a", Rate: 10, Period: time.Second, Burst: 10}, {Name: "b", Algorithm: FixedWindow, Rate: 100, Period: time.Minute}}}},
		{"nowait-general", Config{Strategy: NoWait, Limits: []Limit{{Name: "a", Rate: 10, Period: time.Second, Burst: 10}, {Name: "b", Algorithm: SlidingWindow, Rate: 100, Period: time.Minute}}}},
		{"upsert-async", Config{Strategy: Upsert, AsyncCommit: true, Cooldown: time.Second}},
		{"range", Config{Strategy: Range, Cooldown: time.Second}},
	}
	var b strings.Builder
	for _, c := range configs {
		lim, err := New(nopDB{}, &c.cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		l := lim.(*limiter)
		s := l.plain
		fmt.Fprintf(&b, "== %s fast\n%s\n== %s fastTx\n%s\n== %s peek\n%s\n", c.name, s.Fast, c.name, s.FastTx, c.name, s.Peek)
		if s.General != nil {
			for mode := range modes {
				fmt.Fprintf(&b, "== %s general own %d\n%s\n== %s general tx %d\n%s\n", c.name, mode, s.General.Own[mode], c.name, mode, s.General.Tx[mode])
			}
		}
		k := l.keySQL
		fmt.Fprintf(&b, "== %s keys\n%s\n%s\n%s\n%s\n%s\n", c.name, k.Reset, k.Refund, k.Settle, k.Pause, k.Blank)
	}
	const file = "testdata/statements.golden"
	if *updateGolden {
		if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Errorf("the statements of decisions without an id changed from %s (go test -run TestStatementsGolden -update-statements rewrites it)", file)
	}
}
