package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
)

// A short soak: faults are injected, a failover among them, and the audit
// passes. The figures of a long one are in docs/operations.md.
func TestSoak(t *testing.T) {
	testdb.Slow(t)
	t.Parallel()
	var stdout, stderr bytes.Buffer
	switch code := run(t.Context(), []string{"-soak", "12s"}, &stdout, &stderr); {
	case code == exitError && strings.Contains(stderr.String(), "server binaries"):
		testdb.Missing(t, "%s", stderr.String())
	case code != exitOK:
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
	}
	out := stdout.String()
	for _, want := range []string{"failover", "cooldown, record         ok", "general limits, clients  ok", "busy key, record         ok"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the report:\n%s", want, out)
		}
	}
	t.Log(out)
}
