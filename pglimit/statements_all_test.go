package pglimit

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/cooldown/pglimit/internal/engine"
)

var updateAll = flag.Bool("update-all-statements", false, "rewrite testdata/statements_all.golden")

// Every statement a limiter builds once (the decisions', with and
// without an id, the key operations', the batch statements', those on a
// table Citus distributes) and AllowAll's, for limiters of every
// strategy, limit set and option that changes one, is byte for byte what
// testdata/statements_all.golden holds (by SHA-256): a move of the code that writes
// them changes none.
// captureDB records the statements sent to it, and answers none.
type captureDB struct{ sent *[]string }

var errCaptured = errors.New("captureDB answers no statement")

func (d captureDB) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	*d.sent = append(*d.sent, sql)
	return pgconn.CommandTag{}, errCaptured
}

func (d captureDB) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	*d.sent = append(*d.sent, sql)
	return errRow{}
}

type errRow struct{}

func (errRow) Scan(...any) error { return errCaptured }

func TestStatementsAllGolden(t *testing.T) {
	t.Parallel()
	gcra := Limit{Name: "a", Rate: 10, Period: time.Second, Burst: 10}
	configs := []struct {
		name string
		cfg  Config
	}{
		{"upsert-single", Config{Strategy: Upsert, Limits: []Limit{gcra}}},
		{"nowait-single", Config{Strategy: NoWait, Limits: []Limit{gcra}}},
		{"upsert-general", Config{Strategy: Upsert, Limits: []Limit{gcra, {Name: "b", Algorithm: FixedWindow, Rate: 100, Period: time.Minute}}}},
		{"nowait-general", Config{Strategy: NoWait, Limits: []Limit{gcra, {Name: "b", Algorithm: SlidingWindow, Rate: 100, Period: time.Minute}}}},
		{"upsert-window", Config{Strategy: Upsert, Limits: []Limit{{Name: "w", Algorithm: SlidingWindow, Rate: 7, Period: time.Hour}}}},
		{"upsert-async", Config{Strategy: Upsert, AsyncCommit: true, Cooldown: time.Second}},
		{"nowait-async-general", Config{Strategy: NoWait, AsyncCommit: true, Limits: []Limit{gcra, {Name: "b", Algorithm: FixedWindow, Rate: 100, Period: time.Minute}}}},
		{"upsert-debt", Config{Strategy: Upsert, Limits: []Limit{{Name: "d", Rate: 5, Period: time.Minute, Burst: 5, Debt: 3}, {Name: "e", Algorithm: FixedWindow, Rate: 50, Period: time.Hour, Debt: 10}}}},
		{"upsert-calendar", Config{Strategy: Upsert, Limits: []Limit{{Name: "c", Algorithm: FixedWindow, Rate: 1000, Calendar: "day", TimeZone: "Europe/Paris"}}}},
		{"upsert-overrides", Config{Strategy: Upsert, Overrides: true, Namespace: "ov", Limits: []Limit{gcra, {Name: "o'b", Algorithm: FixedWindow, Rate: 100, Period: time.Minute}}}},
		{"nowait-overrides-single", Config{Strategy: NoWait, Overrides: true, Namespace: "ov1", Schema: "we_ird", Table: "t", Limits: []Limit{gcra}}},
		{"upsert-schema", Config{Strategy: Upsert, Schema: "s", Table: "tab", Namespace: "n", Timeout: 1500 * time.Microsecond, Limits: []Limit{gcra}}},
		{"range", Config{Strategy: Range, Cooldown: time.Second}},
		{"range-schema", Config{Strategy: Range, Schema: "s", Table: "r", Cooldown: time.Minute}},
	}
	var b strings.Builder
	// Each statement's SHA-256 stands for its text: the texts run to
	// 700 kB. A line that differs names the statement that changed.
	put := func(name, part, text string) { fmt.Fprintf(&b, "%x %s %s\n", sha256.Sum256([]byte(text)), name, part) }
	limiters := map[string]*limiter{}
	for _, c := range configs {
		lim, err := New(nopDB{}, &c.cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		l := lim.(*limiter)
		limiters[c.name] = l
		s := l.plain
		put(c.name, "fast", s.Fast)
		put(c.name, "fastTx", s.FastTx)
		put(c.name, "peek", s.Peek)
		if s.General != nil {
			for mode := range modes {
				put(c.name, fmt.Sprintf("general own %d", mode), s.General.Own[mode])
				put(c.name, fmt.Sprintf("general tx %d", mode), s.General.Tx[mode])
			}
		}
		k := l.keySQL
		put(c.name, "keys", strings.Join([]string{k.Reset, k.Refund, k.Settle, k.Pause, k.Blank}, "\n"))
		if ids := l.ids; ids != nil {
			put(c.name, "ids fast", ids.Fast)
			put(c.name, "ids fastTx", ids.FastTx)
			for mode := range modes {
				put(c.name, fmt.Sprintf("ids general %d", mode), ids.General[mode])
				put(c.name, fmt.Sprintf("ids generalTx %d", mode), ids.GeneralTx[mode])
			}
			put(c.name, "ids rest", strings.Join([]string{ids.Lookup, ids.RefundSingle, ids.RefundGeneral, ids.Settle}, "\n"))
		}
		if l.batch != nil {
			cfg := reflect.ValueOf(l.batch).Elem().FieldByName("cfg")
			for _, f := range []string{"SQL", "WaitSQL", "BackSQL"} {
				put(c.name, "batch "+f, cfg.FieldByName(f).String())
			}
		}
		d := engine.Citus(specOf(l.cfg))
		put(c.name, "citus fast", d.Fast)
		put(c.name, "citus fastTx", d.FastTx)
		put(c.name, "citus peek", d.Peek)
		if d.General != nil {
			for mode := range modes {
				put(c.name, fmt.Sprintf("citus own %d", mode), d.General.Own[mode])
				put(c.name, fmt.Sprintf("citus tx %d", mode), d.General.Tx[mode])
			}
		}
	}
	for _, h := range [][]string{
		{"upsert-single", "upsert-general"},
		{"nowait-overrides-single", "upsert-async", "upsert-debt"},
		{"upsert-schema"},
	} {
		levels := make([]level, len(h))
		for i, name := range h {
			levels[i] = level{l: limiters[name], key: "k", index: i}
		}
		for _, inTx := range []bool{false, true} {
			for _, id := range []bool{false, true} {
				put(strings.Join(h, "+"), fmt.Sprintf("hierarchy inTx=%t id=%t", inTx, id), hierarchySQL(levels, inTx, id))
			}
		}
	}
	// The operator's statements, as each call sends them (a limiter on a
	// DB that records them and answers none).
	for _, name := range []string{"upsert-general", "upsert-overrides", "nowait-overrides-single", "upsert-schema"} {
		cfg := limiters[name].cfg
		var sent []string
		lim, err := New(captureDB{&sent}, &cfg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ctx := context.Background()
		calls := []struct {
			op   string
			call func() error
		}{
			{"Inspect", func() error { _, err := Inspect(ctx, lim, "k"); return err }},
			{"LimitedKeys", func() error { _, err := LimitedKeys(ctx, lim, 1, "", 10); return err }},
			{"SetKeyLimits", func() error {
				return SetKeyLimits(ctx, lim, "k", Limit{Name: "a", Rate: 5, Burst: 5})
			}},
			{"SetKeyLimits none", func() error { return SetKeyLimits(ctx, lim, "k") }},
			{"ListKeyLimits", func() error { _, err := ListKeyLimits(ctx, lim, "", 10); return err }},
		}
		for _, c := range calls {
			sent = sent[:0]
			if err := c.call(); err == nil {
				t.Fatalf("%s %s: no error from a DB that answers none", name, c.op)
			}
			put(name, c.op, strings.Join(sent, "\n--\n"))
		}
	}
	const file = "testdata/statements_all.golden"
	if *updateAll {
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
		got, want := strings.Split(b.String(), "\n"), strings.Split(string(want), "\n")
		for i := range max(len(got), len(want)) {
			if i >= len(got) || i >= len(want) || got[i] != want[i] {
				t.Errorf("line %d of %s differs: the statements changed", i+1, file)
				break
			}
		}
	}
}
