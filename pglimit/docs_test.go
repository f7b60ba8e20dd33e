package pglimit_test

import (
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocGoBlocks holds every ```go block of README.md and docs/*.md to code
// that compiles and runs: a block is a copy of consecutive lines of a test
// file, which an HTML comment on the line above it names by its path from
// the repository's root:
//
//	<!-- from pglimitorm/example_gorm_test.go -->
//	```go
//
// Lines are compared without their leading and trailing blanks, so that a
// block may sit at any depth in the doc and in the file (tabs or spaces).
// The file is a *_test.go of one of the Makefile's MODULES, so make test
// compiles it, and runs it when it is an Example with an Output.
func TestDocGoBlocks(t *testing.T) {
	t.Parallel()
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{"../README.md"}, docs...)
	blocks := 0
	for _, doc := range docs {
		src, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(doc, "../")
		bs, err := goBlocks(string(src))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, b := range bs {
			blocks++
			if err := b.check(); err != nil {
				t.Errorf("%s:%d: the ```go block %v", name, b.line, err)
			}
		}
	}
	if blocks == 0 {
		t.Fatal("no ```go block in README.md or docs/*.md: are the docs where this test looks?")
	}
}

// The README opens with the common case: the commands that run the demo
// and the tests, then, before any other block or table, a short ```go
// block of Migrate, New with a Cooldown, Allow and a decision's
// RetryAfter, which TestDocGoBlocks holds to ExampleLimiter_Allow.
func TestReadmeOpensWithCommonCase(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(src)
	commands := "```sh\nmake demo    # runs the demo service"
	first := strings.Index(readme, "```")
	if first < 0 || !strings.HasPrefix(readme[first:], commands) || !strings.Contains(readme[first:], "\nmake test    # every test") {
		t.Fatalf("README.md's first block is not the commands that run the demo and the tests (%q)", commands)
	}
	bs, err := goBlocks(readme)
	if err != nil || len(bs) == 0 {
		t.Fatalf("README.md has no ```go block: %v", err)
	}
	b := bs[0]
	before := strings.Join(strings.Split(readme, "\n")[:b.line-1], "\n")
	if strings.Count(before, "```") != 2 || strings.Contains(before, "\n|") {
		t.Errorf("README.md's first ```go block (line %d) comes after another block or a table: it should follow the two commands", b.line)
	}
	if len(b.lines) > 15 {
		t.Errorf("README.md's first ```go block has %d lines: the common case should take about 10", len(b.lines))
	}
	code := strings.Join(b.lines, "\n")
	for _, want := range []string{"pglimit.Migrate(", "pglimit.New(", "Cooldown:", "lim.Allow(", "d.Allowed", "d.RetryAfter"} {
		if !strings.Contains(code, want) {
			t.Errorf("README.md's first ```go block has no %s: it should show the common case", want)
		}
	}
}

var fromComment = regexp.MustCompile(`^<!-- from (\S+) -->$`)

// A goBlock is a ```go block of a doc: its line (of the opening fence), the
// file its marker names ("" for none), and its lines.
type goBlock struct {
	line  int
	from  string
	lines []string
}

// goBlocks returns the ```go blocks of a Markdown text.
func goBlocks(doc string) ([]goBlock, error) {
	var (
		blocks []goBlock
		open   *goBlock // the block being read, if its fence opened one
		fenced bool     // in a fenced block of any language
		above  string   // the last non-blank line outside blocks
	)
	for i, line := range strings.Split(doc, "\n") {
		trimmed := strings.Trim(line, " \t")
		switch {
		case fenced && trimmed == "```":
			if open != nil {
				blocks = append(blocks, *open)
				open = nil
			}
			fenced = false
		case fenced:
			if open != nil {
				open.lines = append(open.lines, trimmed)
			}
		case strings.HasPrefix(trimmed, "```"):
			fenced = true
			if strings.TrimPrefix(trimmed, "```") == "go" {
				open = &goBlock{line: i + 1}
				if m := fromComment.FindStringSubmatch(above); m != nil {
					open.from = m[1]
				}
			}
		case trimmed != "":
			above = trimmed
		}
	}
	if fenced {
		return nil, fmt.Errorf("a ``` block is not closed")
	}
	return blocks, nil
}

// check says what is wrong with the block, and how to mend it.
func (b goBlock) check() error {
	const mend = "copy consecutive lines of a tested Example or test helper " +
		"(indentation aside), and name their file on the line above the block: " +
		"<!-- from pglimitorm/example_gorm_test.go -->"
	if b.from == "" {
		return fmt.Errorf("has no <!-- from FILE --> comment above it: %s", mend)
	}
	if !strings.HasSuffix(b.from, "_test.go") || !filepath.IsLocal(b.from) {
		return fmt.Errorf("comes from %s, which is not a *_test.go in the repository: %s", b.from, mend)
	}
	src, err := os.ReadFile(filepath.Join("..", b.from))
	if err != nil {
		return fmt.Errorf("comes from %s, which cannot be read (%v): %s", b.from, err, mend)
	}
	var file []string
	for _, line := range strings.Split(string(src), "\n") {
		file = append(file, strings.Trim(line, " \t"))
	}
	// The longest run of the block's lines found in the file, to name the
	// first line that is not there.
	longest := 0
	for start := range file {
		n := 0
		for n < len(b.lines) && start+n < len(file) && file[start+n] == b.lines[n] {
			n++
		}
		if n == len(b.lines) {
			return nil
		}
		longest = max(longest, n)
	}
	return fmt.Errorf("is not in %s as it is: line %d of the doc (%q) does not follow the block's %d lines above it there; "+
		"copy the code from %s again, or change it there first so that its test holds it",
		b.from, b.line+1+longest, b.lines[longest], longest, b.from)
}

// maxContractWords bounds the first sentence of an exported function's or
// method's doc: its contract, in the style of x/time/rate ("AllowN reports
// whether n events may happen at time now."). The mechanism follows in
// later sentences, or in the package's doc.go.
const maxContractWords = 25

// TestDocContracts holds the doc of every exported function and method of
// the packages users import, interface methods included, to open with one
// sentence that names it and states its contract in at most
// maxContractWords words.
func TestDocContracts(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{".", "pglimitsem", "pglimithttp", "pglimitprom", "pglimitsql", "pglimittest", "pglimithealth", "pglimitclean", "pglimitquota"} {
		names, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		fset := token.NewFileSet()
		var files []*ast.File
		for _, name := range names {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		p, err := doc.NewFromFiles(fset, files, "github.com/pglimit/cooldown/pglimit/"+dir)
		if err != nil {
			t.Fatal(err)
		}
		// check holds the doc of the function or method name (of typ,
		// unless "") to the rule.
		check := func(pos token.Pos, typ, name, text string) {
			what := name
			if typ != "" {
				what = typ + "." + name
			}
			first := p.Synopsis(text)
			switch words := len(strings.Fields(first)); {
			case text == "":
				t.Errorf("%v: %s has no doc", fset.Position(pos), what)
			case !strings.HasPrefix(text, name+" "):
				t.Errorf("%v: %s's doc does not begin with its name: %q", fset.Position(pos), what, first)
			case words > maxContractWords:
				t.Errorf("%v: %s's first sentence has %d words, more than %d: "+
					"state the contract in one sentence, then the mechanism: %q",
					fset.Position(pos), what, words, maxContractWords, first)
			}
		}
		for _, f := range p.Funcs {
			check(f.Decl.Pos(), "", f.Name, f.Doc)
		}
		for _, typ := range p.Types {
			for _, f := range typ.Funcs {
				check(f.Decl.Pos(), "", f.Name, f.Doc)
			}
			for _, m := range typ.Methods {
				check(m.Decl.Pos(), typ.Name, m.Name, m.Doc)
			}
			for _, spec := range typ.Decl.Specs {
				iface, ok := spec.(*ast.TypeSpec).Type.(*ast.InterfaceType)
				if !ok {
					continue
				}
				for _, field := range iface.Methods.List {
					if _, ok := field.Type.(*ast.FuncType); !ok || len(field.Names) == 0 || !field.Names[0].IsExported() {
						continue // an embedded interface or an unexported method
					}
					check(field.Pos(), typ.Name, field.Names[0].Name, field.Doc.Text())
				}
			}
		}
	}
}
