package pglimithttp

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

func TestSeconds(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in         time.Duration
		ceil, wait int64
	}{
		{-time.Second, 0, 1},
		{0, 0, 1},
		{time.Nanosecond, 1, 1},
		{999 * time.Millisecond, 1, 1},
		{time.Second, 1, 1},
		{time.Second + time.Nanosecond, 2, 2},
		{1500 * time.Millisecond, 2, 2},
		{2 * time.Second, 2, 2},
		{time.Hour, 3600, 3600},
		{time.Duration(1<<63 - 1), 9223372037, 9223372037},
	} {
		if got := ceilSeconds(tt.in); got != tt.ceil {
			t.Errorf("ceilSeconds(%v) = %d, want %d", tt.in, got, tt.ceil)
		}
		if got := retryAfterSeconds(tt.in); got != tt.wait {
			t.Errorf("retryAfterSeconds(%v) = %d, want %d", tt.in, got, tt.wait)
		}
	}
}

func TestFormatHeaders(t *testing.T) {
	t.Parallel()
	cooldown := pglimit.Limit{Name: "cooldown", Rate: 1, Period: 1500 * time.Millisecond, Burst: 1}
	for _, tt := range []struct {
		limits []pglimit.Limit
		want   string
	}{
		{[]pglimit.Limit{cooldown}, `"cooldown";q=1;w=2`},
		{[]pglimit.Limit{{Name: "sub-second", Rate: 10, Period: 200 * time.Millisecond, Burst: 10}}, `"sub-second";q=10;w=1`},
		{[]pglimit.Limit{
			{Name: "per-minute", Rate: 5, Period: time.Minute, Burst: 3},
			{Name: "per-day", Rate: 20, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
		}, `"per-minute";q=5;w=60, "per-day";q=20;w=86400`},
		{[]pglimit.Limit{{Name: `a "b" \c`, Rate: 1, Period: time.Second}}, `"a \"b\" \\c";q=1;w=1`},
	} {
		if got := formatPolicy(tt.limits); got != tt.want {
			t.Errorf("formatPolicy(%v) = %s, want %s", tt.limits, got, tt.want)
		}
	}
	for _, tt := range []struct {
		name      string
		remaining int
		reset     int64
		want      string
	}{
		{"cooldown", 0, 2, `"cooldown";r=0;t=2`},
		{"per-minute", 2, 12, `"per-minute";r=2;t=12`},
		{"per-day", 17, 0, `"per-day";r=17;t=0`},
		{"odd", -1, 1, `"odd";r=0;t=1`},
	} {
		if got := formatRateLimit(tt.name, tt.remaining, tt.reset); got != tt.want {
			t.Errorf("formatRateLimit(%q, %d, %d) = %s, want %s", tt.name, tt.remaining, tt.reset, got, tt.want)
		}
	}
}

func TestValidatePolicy(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{
		"cooldown":               true,
		"list-items per user":    true,
		`quote" and \backslash`:  true,
		strings.Repeat("p", 64):  true,
		"":                       false,
		strings.Repeat("p", 65):  false,
		"tab\tinside":            false,
		"newline\n":              false,
		"caf\u00e9":              false,
		"\x7f":                   false,
		"header: injection\r\nX": false,
	} {
		if err := validatePolicy(name); (err == nil) != ok {
			t.Errorf("validatePolicy(%q) = %v, want ok=%t", name, err, ok)
		}
	}
}

func TestWriteProblem(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	writeProblem(rec, 400, problem{Title: "Bad Request", Detail: "bad \xff byte"})
	if rec.Code != 400 || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("got %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	var p map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	if p["type"] != "about:blank" || p["status"] != 400.0 || p["title"] != "Bad Request" {
		t.Fatalf("body %v", p)
	}
	if got, want := rec.Header().Get("Content-Length"), len(rec.Body.Bytes()); got != formatSeconds(int64(want)) {
		t.Fatalf("Content-Length %s, body has %d bytes", got, want)
	}
}
