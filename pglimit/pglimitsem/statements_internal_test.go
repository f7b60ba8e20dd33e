package pglimitsem

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit"
)

var update = flag.Bool("update", false, "rewrite testdata/statements.golden")

// A semaphore that uses no flows or levels runs the statements it ran
// before flows were added, byte for byte: testdata/statements.golden was
// written by the code before them, but for the join (enqueue), which
// since takes the waiter's id from its caller, so that a join cut off
// unseen can be taken out by id (TestWaitCancelledJoinLeaves).
func TestStatementsUnchanged(t *testing.T) {
	var b strings.Builder
	for _, listen := range []bool{false, true} {
		cfg := Config{Schema: "s", Namespace: "n", Slots: 3}
		if listen {
			cfg.Listen = &pgx.ConnConfig{}
		}
		s, err := New(struct{ pglimit.DB }{}, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range []struct{ name, text string }{
			{"acquire", s.stmts.acquire}, {"extend", s.stmts.extend}, {"release", s.stmts.release},
			{"wait", s.stmts.wait}, {"enqueue", s.stmts.enqueue}, {"leave", s.stmts.leave},
		} {
			fmt.Fprintf(&b, "-- listen=%v %s\n%s\n", listen, st.name, st.text)
		}
	}
	path := filepath.Join("testdata", "statements.golden")
	if *update {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Errorf("the flow-less statements changed:\n%s\nwant:\n%s", b.String(), want)
	}
}
