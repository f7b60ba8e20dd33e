package fault

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
)

// Wrap names the cause's sentinel once, and a cause the caller's own
// context ended is not the server's; the message is the engine's,
// whoever wraps (the strategies, AllowAll, the semaphore).
func TestWrap(t *testing.T) {
	timedOut, cancel := context.WithTimeoutCause(context.Background(), 0, ErrTimeout)
	defer cancel()
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	gone := errors.New("the client went away")
	goneCtx, cancel3 := context.WithCancelCause(context.Background())
	cancel3(gone)
	live := context.Background()
	lock := &pgconn.PgError{Code: pgtx.CodeLockNotAvailable}
	canceled := &pgconn.PgError{Code: pgtx.CodeQueryCanceled}
	readOnly := &pgconn.PgError{Code: pgtx.CodeReadOnly}
	shutdown := &pgconn.PgError{Code: "57P01"} // admin_shutdown
	plain := errors.New("relation does not exist")
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want error // nil: no sentinel
		msg  string
	}{
		{"its timeout fired", timedOut, context.DeadlineExceeded, ErrTimeout,
			"pglimit: decision timed out (semaphore, after 2s): context deadline exceeded"},
		{"its timeout, carrying it already", timedOut, ErrTimeout, ErrTimeout, "pglimit: semaphore: pglimit: decision timed out"},
		{"the server's lock_timeout", live, lock, ErrTimeout,
			"pglimit: decision timed out (semaphore, by the server's lock_timeout or statement_timeout): :  (SQLSTATE 55P03)"},
		{"a cancel the caller's context sent", cancelled, canceled, nil, "pglimit: semaphore: context canceled: :  (SQLSTATE 57014)"},
		{"read-only", live, readOnly, ErrReadOnly, "pglimit: the server is read-only (a standby?); decisions need the primary (semaphore): :  (SQLSTATE 25006)"},
		{"read-only, the caller's context ended", cancelled, readOnly, ErrReadOnly,
			"pglimit: the server is read-only (a standby?); decisions need the primary (semaphore): :  (SQLSTATE 25006)"},
		{"no read-write server", live, pgconn.ErrReadOnlyConnection, ErrReadOnly, ""},
		{"a server shutting down", live, shutdown, ErrUnavailable, "pglimit: the database is unavailable (semaphore): :  (SQLSTATE 57P01)"},
		{"a connection cut", live, io.ErrUnexpectedEOF, ErrUnavailable, "pglimit: the database is unavailable (semaphore): unexpected EOF"},
		{"a connection cut, the caller's context ended", cancelled, io.ErrUnexpectedEOF, nil, "pglimit: semaphore: context canceled: unexpected EOF"},
		{"cut off by the caller's cause", goneCtx, context.Canceled, nil, "pglimit: semaphore: the client went away: context canceled"},
		{"cut off, carrying the cause already", goneCtx, gone, nil, "pglimit: semaphore: the client went away"},
		{"any other error", live, plain, nil, "pglimit: semaphore: relation does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Wrap(tc.ctx, "semaphore", 2*time.Second, tc.err)
			if !errors.Is(got, tc.err) {
				t.Errorf("Wrap = %v, which does not wrap %v", got, tc.err)
			}
			for _, s := range []error{ErrTimeout, ErrReadOnly, ErrUnavailable} {
				if errors.Is(got, s) != (s == tc.want) {
					t.Errorf("Wrap = %v, want the sentinel %v alone", got, tc.want)
				}
			}
			if tc.msg != "" && got.Error() != tc.msg {
				t.Errorf("Wrap = %q, want %q", got, tc.msg)
			}
		})
	}
}
