package layout

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/pglimit/cooldown"

// mayImport lists, for each package of the main module, the packages
// outside the standard library it may import (a trailing / allows a whole
// tree). It is docs/development.md's "may import" column, held by a test.
var mayImport = map[string][]string{
	"pglimit":                     {"github.com/jackc/pgx/v5/", "github.com/pressly/goose/v3", "~/migrations", "~/pglimit/internal/"},
	"pglimit/internal/queries":    {},
	"pglimit/internal/lockid":     {},
	"pglimit/internal/service":    {},
	"pglimit/internal/preblock":   {},
	"pglimit/internal/flights":    {},
	"pglimit/internal/batch":      {"github.com/jackc/pgx/v5/", "~/pglimit/internal/arith", "~/pglimit/internal/pgtx", "~/pglimit/internal/service"},
	"pglimit/internal/arith":      {},
	"pglimit/internal/fault":      {"~/pglimit/internal/pgtx"},
	"pglimit/internal/engine":     {"github.com/jackc/pgx/v5/", "~/pglimit/internal/arith", "~/pglimit/internal/fault", "~/pglimit/internal/queries"},
	"pglimit/internal/listen":     {"github.com/jackc/pgx/v5/", "~/pglimit/internal/queries"},
	"pglimit/internal/pgtx":       {"github.com/jackc/pgx/v5/", "~/pglimit/internal/queries"},
	"pglimit/internal/cleanup":    {"github.com/jackc/pgx/v5/", "~/pglimit/internal/queries", "~/pglimit/internal/leadership"},
	"pglimit/internal/leadership": {"github.com/jackc/pgx/v5/", "~/pglimit/internal/queries", "~/pglimit/internal/service"},
	"pglimit/pglimitsem":          {"github.com/jackc/pgx/v5/", "~/pglimit", "~/pglimit/internal/"},
	"pglimit/pglimitclean":        {"github.com/jackc/pgx/v5/", "github.com/go-co-op/gocron/v2", "~/pglimit", "~/pglimit/internal/"},
	"pglimit/pglimitquota":        {"github.com/jackc/pgx/v5/", "~/pglimit", "~/pglimit/internal/"},
	"pglimit/pglimithealth":       {"github.com/jackc/pgx/v5/", "~/pglimit", "~/pglimit/internal/"},
	"pglimit/pglimithttp":         {"~/pglimit", "~/pglimit/pglimitsem", "~/internal/onpglimit/observe", "~/internal/onerror"},
	"pglimit/pglimitprom":         {"github.com/jackc/pgx/v5/", "github.com/prometheus/client_golang/", "~/pglimit", "~/pglimit/pglimitclean", "~/pglimit/pglimitsem", "~/internal/onpglimit/observe"},
	"pglimit/pglimitsql":          {"github.com/jackc/pgx/v5/", "~/pglimit"},
	"pglimit/pglimittest":         {"github.com/jackc/pgx/v5/", "~/pglimit", "~/internal/onpglimit/testdb"},
	"migrations":                  {},
	"internal/onpglimit/observe":  {"github.com/jackc/pgx/v5/", "~/pglimit"},
	"internal/onerror":            {},
	"internal/onpglimit/testdb":   {"github.com/jackc/pgx/v5/", "go.uber.org/goleak", "~/pglimit", "~/internal/pgserver"},
	"internal/pgserver":           {"github.com/jackc/pgx/v5/"},
	"internal/layout":             {},
	"cmd/pglimit":                 {"github.com/jackc/pgx/v5/", "~/pglimit", "~/pglimit/pglimitclean", "~/pglimit/pglimithealth", "~/pglimit/pglimitquota"},
	"demo":                        {"github.com/jackc/pgx/v5/", "github.com/prometheus/client_golang/", "~/pglimit", "~/pglimit/pglimitclean", "~/pglimit/pglimithttp", "~/pglimit/pglimitprom", "~/pglimit/pglimitquota", "~/pglimit/pglimitsem", "~/internal/pgserver"},
}

// testing belongs in the test harnesses only, never in what users run.
var mayImportTesting = []string{"pglimit/pglimittest", "internal/onpglimit/testdb"}

// Every package imports only what its line allows, and a new package gets
// a line.
func TestImports(t *testing.T) {
	for pkg, imports := range listImports(t) {
		allowed, ok := mayImport[pkg]
		if !ok {
			t.Errorf("%s has no line in mayImport: add one here, and one in docs/development.md's layout", pkg)
			continue
		}
		for _, imp := range imports {
			if imp == "testing" && !slices.Contains(mayImportTesting, pkg) {
				t.Errorf("%s imports testing", pkg)
			}
			if !strings.Contains(strings.Split(imp, "/")[0], ".") {
				continue // the standard library
			}
			local := strings.Replace(imp, module, "~", 1)
			if !slices.ContainsFunc(allowed, func(a string) bool {
				return local == a || strings.HasSuffix(a, "/") && (strings.HasPrefix(local, a) || local == strings.TrimSuffix(a, "/"))
			}) {
				t.Errorf("%s imports %s, which its line does not allow", pkg, local)
			}
		}
	}
}

// above is the folder of the root internal/ that holds the packages built
// on pglimit; the folders beside it hold the leaves.
const above = "internal/onpglimit/"

// The root internal/ is split by layer, so that no folder holds both a
// package that imports pglimit and a leaf that pglimit's own tree imports
// (pglimithttp imports onerror): every package under internal/onpglimit/
// imports pglimit, and no other package under internal/ imports pglimit or
// anything under internal/onpglimit/.
func TestInternalLayers(t *testing.T) {
	for pkg, imports := range listImports(t) {
		if !strings.HasPrefix(pkg, "internal/") {
			continue
		}
		builtOn := slices.Contains(imports, module+"/pglimit")
		if strings.HasPrefix(pkg, above) {
			if !builtOn {
				t.Errorf("%s does not import pglimit: a leaf belongs directly under internal/, not under %s", pkg, above)
			}
			continue
		}
		for _, imp := range imports {
			local := strings.Replace(imp, module, "~", 1)
			if local == "~/pglimit" || strings.HasPrefix(local, "~/"+above) {
				t.Errorf("%s imports %s: a package built on pglimit belongs under %s", pkg, local, above)
			}
		}
	}
}

// The machinery under pglimit/internal/ is below the root: no package
// there imports pglimit, a package built on it, or the test harness, so
// that the root's types never leak into it (internal/engine takes plain
// values).
func TestPglimitInternalBelowRoot(t *testing.T) {
	for pkg, imports := range listImports(t) {
		if !strings.HasPrefix(pkg, "pglimit/internal/") {
			continue
		}
		for _, imp := range imports {
			local := strings.Replace(imp, module, "~", 1)
			if local == "~/pglimit" || strings.HasPrefix(local, "~/pglimit/") && !strings.HasPrefix(local, "~/pglimit/internal/") ||
				strings.HasPrefix(local, "~/internal/onpglimit/") {
				t.Errorf("%s imports %s: nothing under pglimit/internal/ imports the root or what is built on it", pkg, local)
			}
		}
	}
}

// docs/development.md's layout names every folder that holds a package of
// the main module.
func TestLayoutDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "development.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := bytes.Cut(doc, []byte("## Layout"))
	if !ok {
		t.Fatal("docs/development.md has no Layout section")
	}
	for pkg := range listImports(t) {
		if pkg == "internal/layout" {
			continue
		}
		if !bytes.Contains(layout, []byte("`"+pkg+"/`")) {
			t.Errorf("docs/development.md's layout has no line for %s/", pkg)
		}
	}
}

// listImports returns the non-test imports of every package of the main
// module, by folder.
func listImports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/...")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		pkg := strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")
		if pkg == "" {
			continue // the module's root has no package
		}
		pkgs[pkg] = f[1:]
	}
	return pkgs
}
