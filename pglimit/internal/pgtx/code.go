package pgtx

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATE codes the library reads.
const (
	CodeLockNotAvailable      = "55P03"
	CodeExclusionViolation    = "23P01"
	CodeUniqueViolation       = "23505"
	CodeSerializationFailure  = "40001"
	CodeReadOnly              = "25006" // read_only_sql_transaction: a standby, or read-only mode
	CodeQueryCanceled         = "57014" // statement_timeout, or a cancel request
	CodeInvalidParameterValue = "22023" // such as a time zone the server does not know
	CodeUndefinedTable        = "42P01" // a misspelt Schema or Table, or an unmigrated schema
	CodeUndefinedColumn       = "42703" // a table of another strategy's shape
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

// ServerTimeout reports whether err is a timeout the server enforced: a
// lock_timeout (55P03) or statement_timeout (57014) of the database, the
// role or the session. A client that sends a cancel request on its own
// deadline gets 57014 too; its caller tells the two apart by its context.
func ServerTimeout(err error) bool {
	code := Code(err)
	return code == CodeLockNotAvailable || code == CodeQueryCanceled
}

// Unavailable reports whether err says the server could not be reached or
// was lost: no connection, a connection lost or refused, a server shutting
// down, starting up or out of connections (SQLSTATE classes 08 and 57P,
// and 53300). The caller tells a lost connection from its own cancellation
// by its context.
func Unavailable(err error) bool {
	if code := Code(err); code != "" {
		return strings.HasPrefix(code, "08") || strings.HasPrefix(code, "57P") || code == "53300"
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return true
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// UnknownOutcome reports whether a statement that failed with err may have
// committed: its error came neither before it was sent nor from the server
// aborting it. A connection lost after the statement was sent, a timeout
// that closed it, or a backend terminated while its commit waited for a
// synchronous standby (FATAL, after the commit) all may have.
func UnknownOutcome(err error) bool {
	if pgconn.SafeToRetry(err) {
		return false
	}
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pe.Severity == "FATAL" || pe.Severity == "PANIC"
	}
	return true
}
