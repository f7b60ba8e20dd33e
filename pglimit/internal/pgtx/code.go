package pgtx

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATE codes the library reads.
const (
	CodeLockNotAvailable     = "55P03"
	CodeQueryCanceled        = "57014" // statement_timeout, or a cancel request
	CodeExclusionViolation   = "23P01"
	CodeSerializationFailure = "40001"
	CodeReadOnly             = "25006" // read_only_sql_transaction: a standby, or read-only mode
)

// Code returns the SQLSTATE of err, or "" if it is not a server error.
// It reads pgx's errors and those of any driver whose errors report their
// SQLSTATE the same way (lib/pq's do), so that a caller's transaction on
// database/sql is understood too.
func Code(err error) string {
	if e, ok := errors.AsType[interface {
		error
		SQLState() string
	}](err); ok {
		return e.SQLState()
	}
	return ""
}

// ReadOnly reports whether err says the server could not write: a standby,
// read-only mode, or a connection that pgx knows to be read-only.
func ReadOnly(err error) bool {
	return Code(err) == CodeReadOnly || errors.Is(err, pgconn.ErrReadOnlyConnection)
}

// ServerTimeout reports whether err says the server gave up waiting: a
// lock_timeout (55P03) or a statement_timeout (57014).
func ServerTimeout(err error) bool {
	switch Code(err) {
	case CodeLockNotAvailable, CodeQueryCanceled:
		return true
	}
	return false
}
