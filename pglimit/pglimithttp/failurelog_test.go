package pglimithttp

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestFailureLogIsRateLimited(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	f := &failureLog{log: slog.New(slog.NewTextHandler(&buf, nil)), interval: 10 * time.Second}
	start := time.Now()
	for i := range 1000 { // 1000 failures over 20s
		f.record(start.Add(time.Duration(i)*20*time.Millisecond), "n", i)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d log lines for 1000 failures in 20s with a 10s interval, want 2:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], "n=0 suppressed=0") || !strings.Contains(lines[1], "n=500 suppressed=499") {
		t.Fatalf("lines do not count the failures left out:\n%s", buf.String())
	}
}
