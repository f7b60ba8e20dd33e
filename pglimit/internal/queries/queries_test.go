package queries

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Every statement is used: named in the library's Go code, or included by
// another statement. A statement left behind by a change fails here.
func TestEveryStatementUsed(t *testing.T) {
	used := map[string]bool{}
	root := filepath.Join("..", "..") // the pglimit folder
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					used[s] = true
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	include := regexp.MustCompile(`{{template "([^"]+)"`)
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		b, _ := files.ReadFile(name)
		for _, m := range include.FindAllStringSubmatch(string(b), -1) {
			used[m[1]] = true
		}
	}
	defined := 0
	for _, tmpl := range all.Templates() {
		name := tmpl.Name()
		if name == "" || strings.HasSuffix(name, ".sql") {
			continue // the root and the files' own text: comments
		}
		defined++
		if !used[name] {
			t.Errorf("statement %q is defined but never used", name)
		}
	}
	if defined < 40 {
		t.Errorf("found %d statements; the folder's files did not all parse", defined)
	}
}

// A missing statement or placeholder is a defect, and panics.
func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		name string
		args Args
	}{
		{"no.such.statement", nil},
		{"reset", Args{"table": "t"}}, // no channel
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Text(%q, %v) did not panic", tc.name, tc.args)
				}
			}()
			Text(tc.name, tc.args)
		}()
	}
}

// Comments outside a statement are never sent.
func TestCommentsStayOut(t *testing.T) {
	for _, tmpl := range all.Templates() {
		name := tmpl.Name()
		if name == "" || strings.HasSuffix(name, ".sql") {
			continue
		}
		var b strings.Builder
		_ = tmpl.Execute(&b, map[string]string{}) // placeholders fail; what came before them is enough
		if strings.Contains(b.String(), "\n--") || strings.HasPrefix(b.String(), "--") {
			t.Errorf("statement %q sends a comment:\n%s", name, b.String())
		}
	}
}
