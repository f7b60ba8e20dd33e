// Package layout holds no code: its test keeps every package of the
// repository's main module to what docs/development.md says it may
// import, and the document to one line per folder.
package layout
