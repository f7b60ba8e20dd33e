package pglimit_test

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeProgram keeps the README's complete program compiled and
// tested: its serve function must be Example_application's, byte for byte.
func TestReadmeProgram(t *testing.T) {
	t.Parallel()
	example, err := os.ReadFile("example_app_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src := string(example)
	start := strings.Index(src, "func serve(")
	if start < 0 {
		t.Fatal("example_app_test.go has no func serve")
	}
	end := strings.Index(src[start:], "\n}\n")
	if end < 0 {
		t.Fatal("example_app_test.go: func serve does not end")
	}
	serve := src[start : start+end+len("\n}\n")]
	if !strings.Contains(string(readme), "```go\n") || !strings.Contains(string(readme), serve) {
		t.Errorf("README.md does not show func serve of example_app_test.go as it is; copy it again:\n%s", serve)
	}
}
