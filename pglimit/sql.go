package pglimit

import "fmt"

// sqlf fills a statement template with an already sanitized table name. It
// is the only place SQL text is built, and it never sees user input: keys
// and namespaces travel as parameters, identifiers are validated by
// ValidateIdentifier and quoted by pgx.Identifier.Sanitize.
func sqlf(template, table string) string {
	return fmt.Sprintf(template, table)
}
