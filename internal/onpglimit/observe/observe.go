// Package observe names how a limiter's calls and a request's fate ended:
// the outcome words and error kinds that the Prometheus metrics
// (pglimitprom), the OpenTelemetry ones (pglimitotel), the HTTP middleware
// and the gRPC interceptors share.
package observe

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/cooldown/pglimit"
)

// The outcome vocabulary: one word per outcome, shared by the metrics
// (pglimitprom, pglimitotel: a limiter's calls), the HTTP middleware and
// the gRPC interceptors (a request's fate). A word means the same wherever
// it appears; docs/operations.md lists which layer reports which.
const (
	Admitted = "admitted" // the limits let it through
	Refused  = "refused"  // a limit refused it: 429, ResourceExhausted
	Error    = "error"    // the limiter failed (metrics; a request then gets its error policy)
	Invalid  = "invalid"  // a bad key or cost, or an unsupported call; nothing reached the database

	// Canceled: the caller's context was cancelled before the decision
	// came back, as when an HTTP client disconnects. The caller gave up;
	// the limiter did not fail, so it is no error.
	Canceled = "canceled"

	// Shadowed: a refusal that shadow mode let through
	// (pglimit.Config.Shadow). It consumed nothing.
	Shadowed = "shadowed"

	// A request's fate, beyond its decision.
	BadKey      = "bad_key"     // no valid key in the request: 400, InvalidArgument
	BadCost     = "bad_cost"    // the cost could not be computed or is not valid: 400; nothing consumed
	FailOpen    = "fail_open"   // the limiter failed; the request went through
	FailClosed  = "fail_closed" // the limiter failed; refused as by a limit
	Unavailable = "unavailable" // the limiter failed; 503, Unavailable
	Exempt      = "exempt"      // exempt from limiting: no decision was made
	Busy        = "busy"        // every slot of a concurrency limit was held: 429
)

// Call is one call of a limiter or a semaphore, as it ended: what the
// metrics count.
type Call struct {
	Op       string // the method: "Allow", "AllowN", ..., "Peek", or a semaphore's "Acquire"
	Decides  bool   // whether it admits or refuses: not a Peek, Reset, refund, settle or pause
	Key      string
	Decision pglimit.Decision
	Err      error
	Took     time.Duration
	Outcome  string // one of the outcomes above
}

// NewCall is the decision op on key (a semaphore's acquisition) that ran
// with ctx and ended with d and err after took, its outcome named.
func NewCall(ctx context.Context, op, key string, d pglimit.Decision, err error, took time.Duration) Call {
	return Call{Op: op, Decides: true, Key: key, Decision: d, Err: err, Took: took, Outcome: outcome(ctx, d, err)}
}

// Observed is the operation o that a limiter's [pglimit.Observer] saw end
// with ctx, its outcome named. Observers count the outcomes of those that
// decide, and only the errors of the others (Peek consumes nothing; the
// rest give back, settle or reset), which would inflate the admitted and
// refused rates.
func Observed(ctx context.Context, o pglimit.Observation) Call {
	c := NewCall(ctx, string(o.Op), o.Key, o.Decision, o.Err, o.Took)
	c.Decides = o.Op.Decides()
	return c
}

// outcome names how a call ended.
func outcome(ctx context.Context, d pglimit.Decision, err error) string {
	switch {
	case errors.Is(err, pglimit.ErrInvalidKey) || errors.Is(err, pglimit.ErrInvalidCost) || errors.Is(err, pglimit.ErrUnsupported):
		return Invalid
	case err != nil && errors.Is(err, context.Canceled) && errors.Is(ctx.Err(), context.Canceled):
		// The caller gave up. The limiter's own Timeout and a deadline
		// are failures, and do not count here.
		return Canceled
	case err != nil:
		return Error
	case d.Shadow:
		return Shadowed
	case d.Allowed:
		return Admitted
	}
	return Refused
}

// ErrorKind names the kind of a limiter error: the SQLSTATE of a server
// error (e.g. "57P01" for a terminated backend), "timeout" for
// [pglimit.ErrTimeout] or a deadline, "canceled", "read_only" for
// [pglimit.ErrReadOnly] (a standby), "connect" when no connection could
// be made, "network" for a connection lost on the way, and "other". The
// set of values is bounded.
func ErrorKind(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, pglimit.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, pglimit.ErrReadOnly):
		return "read_only"
	}
	// pgx's errors and lib/pq's (from a caller's transaction) report it so.
	if e, ok := errors.AsType[interface {
		error
		SQLState() string
	}](err); ok && isSQLState(e.SQLState()) {
		return e.SQLState()
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return "connect"
	}
	if _, ok := errors.AsType[net.Error](err); ok || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "network"
	}
	return "other"
}

// isSQLState keeps the kind bounded even if a server sent junk.
func isSQLState(code string) bool {
	if len(code) != 5 {
		return false
	}
	for i := range len(code) {
		if c := code[i]; (c < '0' || c > '9') && (c < 'A' || c > 'Z') {
			return false
		}
	}
	return true
}
