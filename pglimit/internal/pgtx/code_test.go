package pgtx

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// sqlStateError is an error of another driver that reports its SQLSTATE as
// lib/pq's do.
type sqlStateError string

func (e sqlStateError) Error() string    { return "driver error " + string(e) }
func (e sqlStateError) SQLState() string { return string(e) }

func TestCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"pgx", &pgconn.PgError{Code: CodeLockNotAvailable}, CodeLockNotAvailable},
		{"wrapped", fmt.Errorf("decide: %w", &pgconn.PgError{Code: CodeSerializationFailure}), CodeSerializationFailure},
		{"another driver", fmt.Errorf("tx: %w", sqlStateError(CodeExclusionViolation)), CodeExclusionViolation},
		{"no server error", errors.New("connection refused"), ""},
		{"nil", nil, ""},
	} {
		if got := Code(tc.err); got != tc.want {
			t.Errorf("%s: Code = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestReadOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"standby", &pgconn.PgError{Code: CodeReadOnly}, true},
		{"another driver", sqlStateError(CodeReadOnly), true},
		{"other server error", &pgconn.PgError{Code: CodeLockNotAvailable}, false},
		{"not a server error", errors.New("timeout"), false},
	} {
		if got := ReadOnly(tc.err); got != tc.want {
			t.Errorf("%s: ReadOnly = %t, want %t", tc.name, got, tc.want)
		}
	}
}

func TestUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection failure", &pgconn.PgError{Code: "08006"}, true},
		{"shutting down", &pgconn.PgError{Code: "57P01"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"cut off", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{"lock timeout", &pgconn.PgError{Code: CodeLockNotAvailable}, false},
		{"read-only", &pgconn.PgError{Code: CodeReadOnly}, false},
		{"not a server error", errors.New("bad input"), false},
	} {
		if got := Unavailable(tc.err); got != tc.want {
			t.Errorf("%s: Unavailable = %t, want %t", tc.name, got, tc.want)
		}
	}
}
