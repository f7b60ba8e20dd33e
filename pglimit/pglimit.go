package pglimit

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// MaxKeyLength is the longest key or namespace, in bytes, that a limiter
// accepts. Keys are stored in a primary key index, where long values cost
// space and time; 256 bytes fits user ids, e-mail addresses and hashes.
const MaxKeyLength = 256

// Limiter decides whether a key may pass now, with the database as the
// single source of truth shared by every instance of the application. A
// limiter enforces one or more limits ([Config.Limits], or a
// [Config.Cooldown]) on every key at once: a request is admitted only if
// every limit admits it, and then counts against all of them.
//
// Contention is never an error: a request that loses a race is refused.
// All implementations are safe for concurrent use.
type Limiter interface {
	// Allow is AllowN with n = 1.
	Allow(ctx context.Context, key string) (Decision, error)

	// AllowN decides for a request of cost n (units) and, when it admits,
	// counts n against every limit. An n that no limit could ever admit
	// at once (n > Burst for GCRA, n > Rate for a window) is
	// [ErrInvalidCost], as is n <= 0.
	AllowN(ctx context.Context, key string, n int) (Decision, error)

	// AllowTx is AllowTxN with n = 1.
	AllowTx(ctx context.Context, tx DB, key string) (Decision, error)

	// AllowTxN is AllowN inside the caller's transaction tx; its units
	// count only if tx commits.
	//
	// tx is a pgx.Tx, or a database/sql transaction (GORM's, sqlx's, ...)
	// through pglimitsql.Tx. AllowTxN never aborts tx, but cancelling ctx
	// while its statement runs ends tx; the package doc's Transactions
	// section says how it waits, dates and fails.
	AllowTxN(ctx context.Context, tx DB, key string, n int) (Decision, error)

	// AllowAtMost admits as many of n units as every limit allows now, at
	// least one, and reports how many in [Decision.Granted].
	//
	// It refuses only when not even one unit is available. n may exceed
	// what the limits could admit at once.
	AllowAtMost(ctx context.Context, key string, n int) (Decision, error)

	// Reserve admits n units now if the key's GCRA limits would admit them
	// within maxDelay, and reports in [Decision.Delay] how long to wait
	// before acting.
	//
	// The Delay is zero when the units fit the burst now. Reserve refuses
	// when the wait would exceed maxDelay, with the RetryAfter of the same
	// call: the wait less maxDelay, after which a Reserve with the same
	// maxDelay admits. Like nginx's burst without nodelay: requests are
	// queued, not refused, up to a point.
	// [ErrUnsupported] for window limits and for the Range strategy.
	Reserve(ctx context.Context, key string, n int, maxDelay time.Duration) (Decision, error)

	// Refund gives back n of the units admission d took, for work that did
	// not happen, and reports whether every limit took them back.
	//
	// A failed export, say, should not count. Refund never gives back more
	// than d took, and never leaves the key better off than if those units
	// had not been asked for: each limit takes them back only while the
	// admission still weighs on it as it left it. A GCRA limit, only if
	// nothing admitted since still counts (its TAT is the one d left); a
	// window, only within the window d counted in. Each limit decides for
	// itself: true means that every limit took the units back, false that at
	// least one kept them (any other took them back), which is no error.
	// Either way the n units are spent: d has n fewer left to give back. So
	// are they when Refund fails after its statement was sent (a connection
	// lost), since it may have given them back: no units are ever given back
	// twice.
	//
	// A decision of AllowTx or AllowTxN gives back only what its
	// transaction committed. If the transaction rolled back, or a savepoint
	// of it around the decision did, d took nothing, and Refund gives
	// nothing back and reports false. While that transaction is open,
	// Refund cannot know: it is [ErrInvalidCost], changes nothing, and
	// does not wait for the transaction; refund after the commit (work
	// that fails inside the transaction needs no refund, as its rollback
	// gives the units back). A decision so old that the server no longer
	// knows whether its transaction committed is not refunded: false.
	//
	// [ErrUnsupported] on Range, on a table Citus distributes, and for
	// units served from a lease; [ErrNotAdmitted] for a decision that took
	// no units from the database (a refusal, a shadow or fallback
	// admission, a zero Decision); [ErrForeignDecision] for another
	// limiter's decision (another value of [New], even of the same
	// Config); [ErrInvalidCost] for n not positive, or more units than
	// are left. [Settle] names each misuse with the same sentinel.
	Refund(ctx context.Context, d Decision, n int) (bool, error)

	// Peek returns the decision AllowN(ctx, key, n) would make now, and
	// consumes nothing: it takes no lock and writes nothing.
	Peek(ctx context.Context, key string, n int) (Decision, error)

	// Reset clears the key's state, so that every limit is back to its full
	// burst or quota.
	Reset(ctx context.Context, key string) error

	// Policy returns what the limiter enforces.
	Policy() Policy
}

// Policy is what a limiter enforces: its limits on every key of its
// namespace, with its strategy. HTTP headers and metrics read it.
type Policy struct {
	// Namespace is the limiter's [Config.Namespace], or when that is
	// unset the one derived from its limits.
	Namespace string
	Strategy  Strategy
	// Limits are the limiter's limits with defaults filled in (a Cooldown
	// is the one limit "cooldown": 1 per Cooldown, burst 1).
	Limits []Limit
}

// LongestWait is the longest any of the policy's limits can make a key
// wait.
//
// That is a full burst for GCRA, a window, two for a sliding window. It is
// the RetryAfter of a refusal whose own wait is unknown, such as an answer
// given while the database is down.
func (p Policy) LongestWait() time.Duration {
	var w time.Duration
	for _, l := range p.Limits {
		w = max(w, l.longestWait())
	}
	return w
}

// DB is what a limiter needs from PostgreSQL. *pgxpool.Pool, *pgx.Conn and
// pgx.Tx satisfy it; package pglimitsql adapts database/sql's *sql.DB and
// transactions to it.
type DB interface {
	// Exec runs sql with args, as pgx's Exec does.
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	// QueryRow runs sql with args and returns its first row, as pgx's
	// QueryRow does.
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// made is the limiter New made that lim is, for op; else ErrInvalidConfig.
func made(lim Limiter, op string) (*limiter, error) {
	l, ok := lim.(*limiter)
	if !ok {
		return nil, fmt.Errorf("%w: %s: a Limiter that pglimit.New did not make", ErrInvalidConfig, op)
	}
	return l, nil
}

// New returns a limiter of cfg.Strategy over db.
func New(db DB, cfg *Config) (Limiter, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	// The only SQL text built at run time: the table name, validated by
	// ValidateIdentifier and quoted by Sanitize. Keys and namespaces always
	// travel as parameters.
	table := pgx.Identifier{c.Schema, c.Table}.Sanitize()
	l := newLimiter(db, c, table)
	if c.Fallback != nil {
		if l.fallback, err = newFallback(c.Fallback, c.Namespace); err != nil {
			return nil, err
		}
	}
	switch c.Strategy {
	case NoWait:
		return newNoWait(l, table), nil
	case Range:
		return newRange(l, table), nil
	default:
		return newUpsert(l, table), nil
	}
}
