// Package fault holds pglimit's sentinel errors and the one wrapping that
// adds the sentinel of a database failure's cause, so that the engine and
// pglimitsem raise errors of one identity and one message. The root
// package re-exports every sentinel (ErrTimeout = fault.ErrTimeout, as
// os.ErrNotExist is fs.ErrNotExist, raised from internal/oserror) and
// documents when each is returned.
package fault

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
)

// ExtensionSchema is the schema in which pglimit.Migrate creates
// btree_gist when the database lacks it; ErrExtension's message names it.
const ExtensionSchema = "pglimit_ext"

// The sentinels, documented where the root package re-exports them.
var (
	ErrInvalidKey            = errors.New("pglimit: invalid key")
	ErrInvalidID             = errors.New("pglimit: invalid decision id")
	ErrInvalidConfig         = errors.New("pglimit: invalid config")
	ErrTimeout               = errors.New("pglimit: decision timed out")
	ErrNoExclusionConstraint = errors.New("pglimit: the Range table has no exclusion constraint; run pglimit.Migrate on its schema to restore it")
	ErrUnsupported           = errors.New("pglimit: unsupported")
	ErrReadOnly              = errors.New("pglimit: the server is read-only (a standby?); decisions need the primary")
	ErrUnavailable           = errors.New("pglimit: the database is unavailable")
	ErrInvalidCost           = errors.New("pglimit: invalid cost")
	ErrNotAdmitted           = errors.New("pglimit: the decision admitted nothing")
	ErrAlreadySettled        = errors.New("pglimit: the decision was settled already")
	ErrForeignDecision       = errors.New("pglimit: the decision is another limiter's")
	ErrExtension             = errors.New("pglimit: the database has no btree_gist extension, which the Range strategy needs; " +
		"install PostgreSQL's contrib modules (Debian/Ubuntu: apt-get install postgresql-contrib), " +
		"run CREATE SCHEMA " + ExtensionSchema + "; CREATE EXTENSION btree_gist SCHEMA " + ExtensionSchema +
		" as a superuser or a role with CREATE on the database, then pglimit.Migrate again")
)

// Wrap adds what failed (a strategy's name, "semaphore", an operation)
// and the sentinel of the cause to err, from a statement run under ctx,
// which timeout bounds: ErrTimeout when that timeout fired (the pgx error
// then only says the context was cancelled) or the server's did (a
// lock_timeout or statement_timeout of the database or role),
// ErrReadOnly when the server could not write, ErrUnavailable when it
// could not be reached. A cause the caller's own context ended is not
// the server's: it is no ErrTimeout nor ErrUnavailable, and err gets
// that context's cause ([context.Cause]). An err that carries the
// sentinel or the cause already does not get it twice.
func Wrap(ctx context.Context, what string, timeout time.Duration, err error) error {
	switch {
	case errors.Is(context.Cause(ctx), ErrTimeout) && !errors.Is(err, ErrTimeout):
		return fmt.Errorf("%w (%s, after %s): %w", ErrTimeout, what, timeout, err)
	case ctx.Err() == nil && pgtx.ServerTimeout(err) && !errors.Is(err, ErrTimeout):
		return fmt.Errorf("%w (%s, by the server's lock_timeout or statement_timeout): %w", ErrTimeout, what, err)
	case IsReadOnly(err):
		return fmt.Errorf("%w (%s): %w", ErrReadOnly, what, err)
	case ctx.Err() == nil && pgtx.Unavailable(err) && !errors.Is(err, ErrUnavailable):
		return fmt.Errorf("%w (%s): %w", ErrUnavailable, what, err)
	case ctx.Err() != nil && !errors.Is(err, context.Cause(ctx)):
		// The driver's error for a statement the caller's context cut off
		// says only ctx.Err(); the caller's cause is what it set.
		return fmt.Errorf("pglimit: %s: %w: %w", what, context.Cause(ctx), err)
	}
	return fmt.Errorf("pglimit: %s: %w", what, err)
}

// IsReadOnly reports whether err says that the server cannot write, and
// does not say so as ErrReadOnly yet: SQLSTATE 25006, or no read-write server
// for a pool that asks for one.
func IsReadOnly(err error) bool {
	return !errors.Is(err, ErrReadOnly) && pgtx.ReadOnly(err)
}
