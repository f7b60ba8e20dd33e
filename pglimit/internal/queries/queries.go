// Package queries holds every SQL statement the library sends, in the .sql
// files of this folder, and fills in their placeholders.
//
// A file defines its statements as templates ({{define "name"}} ...
// {{end}}), with named placeholders ({{.table}}) for what a limiter knows
// only once configured: its table, its lock clause, and the decision
// arithmetic that the engine writes for its limits. Text outside a
// {{define}}, comments included, is never sent. A statement may include
// another ({{template "name" .}}) where two share a tail. The migrations,
// which goose applies, are in the repository's migrations folder.
package queries

import (
	"embed"
	"fmt"
	"strings"
	"text/template"
)

//go:embed *.sql
var files embed.FS

var all = template.Must(template.New("").Option("missingkey=error").ParseFS(files, "*.sql"))

// Args fills a statement's placeholders, by name.
type Args map[string]string

// Text returns the statement name, with its placeholders filled from args.
// A statement or a placeholder that does not exist is a defect of the
// library, not of its input, so it panics; every statement is built when a
// limiter is, and the tests build them all.
func Text(name string, args Args) string {
	var b strings.Builder
	if err := all.ExecuteTemplate(&b, name, args); err != nil {
		panic(fmt.Sprintf("queries: %s: %v", name, err))
	}
	return strings.TrimSpace(b.String())
}

// Static returns the statement name, which has no placeholders.
func Static(name string) string { return Text(name, nil) }
