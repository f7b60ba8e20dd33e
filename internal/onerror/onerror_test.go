package onerror

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLogIsRateLimited(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	f := &Log{Logger: slog.New(slog.NewTextHandler(&buf, nil)), Interval: 10 * time.Second, Message: "failed"}
	start := time.Now()
	for i := range 1000 { // 1000 failures over 20s
		f.Record(start.Add(time.Duration(i)*20*time.Millisecond), "n", i)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d log lines for 1000 failures in 20s with a 10s interval, want 2:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], "n=0 suppressed=0") || !strings.Contains(lines[1], "n=500 suppressed=499") {
		t.Fatalf("lines do not count the failures left out:\n%s", buf.String())
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	for _, p := range []Policy{Unavailable, FailOpen, FailClosed} {
		if got, err := Parse(p.String()); err != nil || got != p || !p.Valid() {
			t.Errorf("Parse(%q) = %v, %v", p, got, err)
		}
	}
	if p, err := Parse("fail-sometimes"); err == nil || Policy(7).Valid() {
		t.Errorf("Parse(fail-sometimes) = %v, %v; Policy(7).Valid() = %t", p, err, Policy(7).Valid())
	}
}
