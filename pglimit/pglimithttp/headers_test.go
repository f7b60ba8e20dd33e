package pglimithttp

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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
	for _, tt := range []struct {
		name            string
		cooldown, reset time.Duration
		policy, limit   string
	}{
		{"cooldown", 2 * time.Second, 2 * time.Second, `"cooldown";q=1;w=2`, `"cooldown";r=0;t=2`},
		{"cooldown", 2 * time.Second, 1100 * time.Millisecond, `"cooldown";q=1;w=2`, `"cooldown";r=0;t=2`},
		{"cooldown", 2 * time.Second, 900 * time.Millisecond, `"cooldown";q=1;w=2`, `"cooldown";r=0;t=1`},
		{"sub-second", 200 * time.Millisecond, 150 * time.Millisecond, `"sub-second";q=1;w=1`, `"sub-second";r=0;t=1`},
		{"minute", time.Minute, 0, `"minute";q=1;w=60`, `"minute";r=0;t=0`},
		{`a "b" \c`, time.Second, time.Second, `"a \"b\" \\c";q=1;w=1`, `"a \"b\" \\c";r=0;t=1`},
	} {
		if got := formatPolicy(tt.name, tt.cooldown); got != tt.policy {
			t.Errorf("formatPolicy(%q, %v) = %s, want %s", tt.name, tt.cooldown, got, tt.policy)
		}
		if got := formatRateLimit(tt.name, tt.reset); got != tt.limit {
			t.Errorf("formatRateLimit(%q, %v) = %s, want %s", tt.name, tt.reset, got, tt.limit)
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
