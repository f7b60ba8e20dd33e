package pglimitquota

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pglimit/cooldown/pglimit"
)

var update = flag.Bool("update", false, "rewrite testdata/statements.golden")

// The statements a quota sends, byte for byte: a change to one shows in
// the diff of testdata/statements.golden (go test -run TestStatements
// -update rewrites it).
func TestStatements(t *testing.T) {
	q, err := New(struct{ pglimit.DB }{}, &Config{Schema: "s", Namespace: "n"})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, st := range []struct{ name, text string }{
		{"allow", q.stmts.allow}, {"allow_id", q.stmts.allowID}, {"allow_kept", q.stmts.kept}, {"allow_kept_id", q.stmts.keptID},
		{"usage", q.stmts.usage}, {"set_plan", q.stmts.setPlan},
		{"grant", q.stmts.grant}, {"lookup_id", q.stmts.lookupID}, {"take_events", q.stmts.takeEvents},
		{"refund", q.stmts.refund}, {"settle", q.stmts.settle}, {"forget", q.stmts.forget},
	} {
		fmt.Fprintf(&b, "-- %s\n%s\n", st.name, st.text)
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
		t.Errorf("the statements changed:\n%s\nwant:\n%s", b.String(), want)
	}
}
