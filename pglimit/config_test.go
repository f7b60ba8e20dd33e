package pglimit_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

func TestValidateKey(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		key string
		ok  bool
	}{
		{"user-42", true},
		{"ünïcødé 用户", true},
		{strings.Repeat("k", pglimit.MaxKeyLength), true},
		{"", false},
		{strings.Repeat("k", pglimit.MaxKeyLength+1), false},
		{"\xff\xfe", false},
		{"a\x00b", false},
	} {
		err := pglimit.ValidateKey(tt.key)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, pglimit.ErrInvalidKey)) {
			t.Errorf("ValidateKey(%q) = %v, want ok=%t", tt.key, err, tt.ok)
		}
	}
}

func TestValidateIdentifier(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		ok   bool
	}{
		{"pglimit_upsert", true},
		{"_private", true},
		{strings.Repeat("t", 63), true},
		{"", false},
		{strings.Repeat("t", 64), false},
		{"1table", false},
		{"Limits", false},
		{`a"b`, false},
		{"a.b", false},
		{"x; DROP TABLE y", false},
		{"tablé", false},
	} {
		if err := pglimit.ValidateIdentifier(tt.name); (err == nil) != tt.ok {
			t.Errorf("ValidateIdentifier(%q) = %v, want ok=%t", tt.name, err, tt.ok)
		}
	}
}

// A caller that changes the list it got changes nobody else's.
func TestStrategiesIsTheCallers(t *testing.T) {
	t.Parallel()
	got := pglimit.Strategies()
	got[0] = "redis"
	if again := pglimit.Strategies(); !slices.Equal(again, []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait, pglimit.Range}) {
		t.Errorf("Strategies() after a caller changed its copy = %v", again)
	}
	for _, s := range pglimit.Strategies() {
		if got, err := pglimit.ParseStrategy(string(s)); err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %q, %v", s, got, err)
		}
	}
}

func TestParseStrategy(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]pglimit.Strategy{"upsert": pglimit.Upsert, " NoWait ": pglimit.NoWait, "RANGE": pglimit.Range} {
		if got, err := pglimit.ParseStrategy(in); err != nil || got != want {
			t.Errorf("ParseStrategy(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := pglimit.ParseStrategy("redis"); !errors.Is(err, pglimit.ErrInvalidConfig) {
		t.Errorf("ParseStrategy(redis) = %v, want ErrInvalidConfig", err)
	}
	if _, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Strategy: "redis", Cooldown: time.Second}); !errors.Is(err, pglimit.ErrInvalidConfig) {
		t.Errorf("New with an unknown strategy = %v, want ErrInvalidConfig", err)
	}
	if _, err := pglimit.New(testdb.Pool(t), nil); !errors.Is(err, pglimit.ErrInvalidConfig) {
		t.Errorf("New with a nil Config = %v, want ErrInvalidConfig", err)
	}
}

func FuzzValidateKey(f *testing.F) {
	for _, seed := range []string{"user-42", "", "\xff", "a\x00b", strings.Repeat("k", 300), "'; DROP TABLE x; --"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := pglimit.ValidateKey(key)
		valid := key != "" && len(key) <= pglimit.MaxKeyLength && utf8.ValidString(key) && !strings.ContainsRune(key, 0)
		if valid != (err == nil) {
			t.Fatalf("ValidateKey(%q) = %v, want valid=%t", key, err, valid)
		}
		if err != nil && !errors.Is(err, pglimit.ErrInvalidKey) {
			t.Fatalf("ValidateKey(%q) = %v, not ErrInvalidKey", key, err)
		}
	})
}

func FuzzValidateIdentifier(f *testing.F) {
	for _, seed := range []string{"pglimit_upsert", "", "A", `x"; --`, "a b", "\xff"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if pglimit.ValidateIdentifier(name) != nil {
			return
		}
		// An accepted name must need no quoting: quoting it changes nothing
		// but the quotes.
		if got := (pgx.Identifier{name}).Sanitize(); got != `"`+name+`"` || len(name) > 63 {
			t.Fatalf("accepted %q, which sanitizes to %s", name, got)
		}
		for _, r := range name {
			if ok := r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9'; !ok {
				t.Fatalf("accepted %q with rune %q", name, r)
			}
		}
	})
}
