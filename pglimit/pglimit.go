package pglimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// MaxKeyLength is the longest key or namespace, in bytes, that a limiter
// accepts. Keys are stored in a primary key index, where long values cost
// space and time; 256 bytes fits user ids, e-mail addresses and hashes.
const MaxKeyLength = 256

// Sentinel errors. Errors returned by this package wrap one of these (or a
// database error) so callers can test them with [errors.Is].
var (
	// ErrInvalidKey reports a key or namespace that is empty, longer than
	// [MaxKeyLength], not valid UTF-8, or contains a NUL byte.
	ErrInvalidKey = errors.New("pglimit: invalid key")

	// ErrInvalidConfig reports a [Config] that cannot be used; the message
	// names the field.
	ErrInvalidConfig = errors.New("pglimit: invalid config")

	// ErrTimeout reports a decision that did not finish within
	// [Config.Timeout]. The caller's own context deadline is reported as
	// [context.DeadlineExceeded] instead.
	ErrTimeout = errors.New("pglimit: decision timed out")

	// ErrNoExclusionConstraint reports a Range table without the exclusion
	// constraint that makes it a limiter (its btree_gist extension was
	// dropped, say). A Range limiter refuses to decide on such a table; run
	// [Migrate] on its schema to restore the constraint.
	ErrNoExclusionConstraint = errors.New("pglimit: the Range table has no exclusion constraint; run pglimit.Migrate on its schema to restore it")
)

// Limiter decides whether a key may pass now, with the database as the
// single source of truth shared by every instance of the application.
//
// All implementations are safe for concurrent use.
type Limiter interface {
	// Allow decides for key and, when it admits, starts the key's cooldown.
	// Contention is never an error: a request that loses a race is refused.
	Allow(ctx context.Context, key string) (Decision, error)

	// AllowTx is Allow inside the caller's transaction: the cooldown is
	// consumed only if tx commits, and it runs from the decision's write,
	// not from the commit. While tx is open, other requests for the same
	// key wait for it, up to Config.Timeout (NoWait refuses them instead,
	// except for a key tx admits for the first time, whose new row they
	// wait on). AllowTx never aborts tx: its statement runs in a savepoint,
	// so a lost race (at any isolation level) is a refusal and a wait past
	// Config.Timeout, bounded on the server by lock_timeout, is
	// [ErrTimeout], and tx stays usable either way. Cancelling ctx while
	// the statement runs does end tx, because pgx then closes the
	// connection.
	AllowTx(ctx context.Context, tx pgx.Tx, key string) (Decision, error)

	// Reset lifts the key's cooldown, so its next request is admitted.
	Reset(ctx context.Context, key string) error
}

// Decision is the outcome of [Limiter.Allow]. Durations are measured on the
// database clock, when the decision's statement ends; a cooldown starts
// when the decision writes it, after any wait for a lock.
type Decision struct {
	// Allowed reports whether the request was admitted.
	Allowed bool

	// RetryAfter is how long a refused caller should wait before the key
	// may be admitted; zero when Allowed. When a concurrent decision was in
	// flight and the end of its cooldown is not known, it is the whole
	// cooldown, an upper bound.
	RetryAfter time.Duration

	// ResetAfter is the time left until the key's cooldown ends: about the
	// cooldown for an admission, RetryAfter for a refusal.
	ResetAfter time.Duration

	// estimated marks a RetryAfter that is an upper bound, not a reading.
	estimated bool
}

// Strategy selects the SQL a limiter uses. All strategies keep the same
// promises; they differ in cost under contention and in table growth.
type Strategy string

const (
	// Upsert updates the key's row only when its cooldown has ended (an
	// UPDATE with that guard), or inserts it for a key never seen. One round
	// trip, one row per key.
	Upsert Strategy = "upsert"

	// NoWait locks the key's row with SELECT ... FOR UPDATE NOWAIT, then
	// updates or inserts it, and treats a row locked by someone else as a
	// refusal. One round trip, one row per key.
	NoWait Strategy = "nowait"

	// Range inserts the cooldown as a tstzrange into a table whose
	// exclusion constraint forbids overlaps. One round trip, one row per
	// admission: it needs the cleanup job.
	Range Strategy = "range"
)

// Strategies lists every strategy, in the order reports show them.
var Strategies = []Strategy{Upsert, NoWait, Range}

// ParseStrategy returns the strategy named s (case-insensitive).
func ParseStrategy(s string) (Strategy, error) {
	st := Strategy(strings.ToLower(strings.TrimSpace(s)))
	switch st {
	case Upsert, NoWait, Range:
		return st, nil
	}
	return "", fmt.Errorf("%w: Strategy %q is not one of upsert, nowait, range", ErrInvalidConfig, s)
}

// Config configures a limiter. A nil Config is invalid because Cooldown has
// no sensible default; every other zero field takes its default.
type Config struct {
	// Strategy selects the SQL. Defaults to [Upsert].
	Strategy Strategy

	// Cooldown is the least time between two admissions of the same key.
	// Required; must be positive.
	Cooldown time.Duration

	// Namespace separates limiters that share a table (one per endpoint or
	// cooldown). Same rules as a key. Defaults to "default".
	Namespace string

	// Schema holds the limiter's table. A plain identifier. Defaults to
	// "public".
	Schema string

	// Table is the limiter's table. A plain identifier, of the shape the
	// migrations create for the strategy. Defaults to "pglimit_upsert",
	// "pglimit_nowait" or "pglimit_range".
	Table string

	// Timeout bounds each decision on top of the caller's context; past it
	// the decision fails with [ErrTimeout]. Defaults to 2s.
	Timeout time.Duration

	// PlainInsert makes the Range strategy use a plain INSERT and treat an
	// exclusion violation as a refusal, as the article that inspired this
	// package did. It exists so the load test can compare; do not use it.
	// Defaults to false.
	PlainInsert bool

	// AsyncCommit commits the limiter's own writes with synchronous_commit
	// off, so an admission does not wait for its WAL flush (+40% admissions
	// in the README's benchmark on a disk that flushes in 19µs; more where
	// flushes are slow). The setting is local to
	// the limiter's statement (never the session, never the application's
	// other queries on a shared pool) and is not applied by AllowTx, where
	// the caller's commit decides. The cost: a database crash may lose the
	// last fraction of a second of admissions, so a key admitted just
	// before the crash may be admitted once more, early, after it. Defaults
	// to false.
	AsyncCommit bool

	// PreBlockSize, when positive, turns on the local pre-block: after the
	// database has decided that a key is in cooldown until T, this process
	// refuses the key until T without a round trip, remembering at most
	// PreBlockSize keys (a full cache forgets keys, which only costs round
	// trips). It never refuses past the end of a cooldown the database
	// reported, but a Reset made by another instance reaches this one only
	// when the remembered cooldown ends: at most Cooldown later. A Reset
	// through this limiter clears its own entry at once. Defaults to 0
	// (off).
	PreBlockSize int
}

const (
	defaultNamespace = "default"
	defaultSchema    = "public"
	defaultTimeout   = 2 * time.Second
)

var defaultTables = map[Strategy]string{
	Upsert: "pglimit_upsert",
	NoWait: "pglimit_nowait",
	Range:  "pglimit_range",
}

// DB is what a limiter needs from PostgreSQL. *pgxpool.Pool, *pgx.Conn and
// pgx.Tx satisfy it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
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
	b := base{db: db, cfg: c}
	b.args.namespace, b.args.cooldown = c.Namespace, c.Cooldown.Microseconds()
	b.args.lockClass = keyLockClass(table, c.Namespace)
	if c.PreBlockSize > 0 {
		b.preblock = newPreblock(c.PreBlockSize)
	}
	switch c.Strategy {
	case NoWait:
		return newNoWait(b, table), nil
	case Range:
		return newRange(b, table), nil
	default:
		return newUpsert(b, table), nil
	}
}

func (c *Config) withDefaults() (Config, error) {
	if c == nil {
		return Config{}, fmt.Errorf("%w: Config is nil; Cooldown is required", ErrInvalidConfig)
	}
	out := *c
	out.Strategy = cmp.Or(out.Strategy, Upsert)
	if _, err := ParseStrategy(string(out.Strategy)); err != nil {
		return Config{}, err
	}
	if out.Cooldown <= 0 {
		return Config{}, fmt.Errorf("%w: Cooldown must be positive, got %s", ErrInvalidConfig, out.Cooldown)
	}
	out.Namespace = cmp.Or(out.Namespace, defaultNamespace)
	if err := ValidateKey(out.Namespace); err != nil {
		return Config{}, fmt.Errorf("%w: Namespace: %w", ErrInvalidConfig, err)
	}
	out.Schema = cmp.Or(out.Schema, defaultSchema)
	if err := ValidateIdentifier(out.Schema); err != nil {
		return Config{}, fmt.Errorf("%w: Schema: %w", ErrInvalidConfig, err)
	}
	out.Table = cmp.Or(out.Table, defaultTables[out.Strategy])
	if err := ValidateIdentifier(out.Table); err != nil {
		return Config{}, fmt.Errorf("%w: Table: %w", ErrInvalidConfig, err)
	}
	if out.Timeout < 0 {
		return Config{}, fmt.Errorf("%w: Timeout must not be negative, got %s", ErrInvalidConfig, out.Timeout)
	}
	out.Timeout = cmp.Or(out.Timeout, defaultTimeout)
	if out.PreBlockSize < 0 {
		return Config{}, fmt.Errorf("%w: PreBlockSize must not be negative, got %d", ErrInvalidConfig, out.PreBlockSize)
	}
	if out.PlainInsert && out.Strategy != Range {
		return Config{}, fmt.Errorf("%w: PlainInsert applies only to the Range strategy", ErrInvalidConfig)
	}
	return out, nil
}

// ValidateKey reports whether key can be used as a key or namespace: it must
// be non-empty, at most [MaxKeyLength] bytes, valid UTF-8 and free of NUL
// bytes (which PostgreSQL text cannot hold). The error wraps [ErrInvalidKey].
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLength:
		return fmt.Errorf("%w: %d bytes, more than the maximum of %d", ErrInvalidKey, len(key), MaxKeyLength)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: contains a NUL byte", ErrInvalidKey)
	}
	return nil
}

var identifierRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateIdentifier reports whether name is a plain, lower-case SQL
// identifier of at most 63 bytes (PostgreSQL's limit): a letter or
// underscore, then letters, digits or underscores. Such a name means the same
// quoted or not, so schemas made by hand and by migrations agree.
func ValidateIdentifier(name string) error {
	if !identifierRE.MatchString(name) {
		return fmt.Errorf("%q is not a plain identifier (lower-case letters, digits and _, at most 63 bytes, not starting with a digit)", name)
	}
	return nil
}

// base holds what every strategy shares.
type base struct {
	db       DB
	cfg      Config
	preblock *preblock // nil when off

	// args holds the statement parameters that never change, boxed once
	// instead of at every decision.
	args struct{ namespace, cooldown, lockClass any }
}

// keyLockClass is the first half of the advisory lock a first request
// takes on its key (the second is the key's hash, computed in SQL): one
// class per table and namespace, so that limiters on other tables or
// namespaces never wait for each other.
func keyLockClass(table, namespace string) int32 {
	h := fnv.New32a()
	h.Write([]byte(table))
	h.Write([]byte{0})
	h.Write([]byte(namespace))
	return int32(h.Sum32())
}

// decide validates key, answers from the pre-block when it can, bounds ctx
// by the limiter's timeout and runs fn. Only decisions made outside a
// caller's transaction (inTx false) feed the pre-block: a caller's
// transaction may still roll back what it saw.
func (b *base) decide(ctx context.Context, key string, inTx bool, fn func(ctx context.Context) (Decision, error)) (Decision, error) {
	if err := ValidateKey(key); err != nil {
		return Decision{}, err
	}
	sent := time.Now()
	if wait := b.preblock.remaining(key, sent); wait > 0 {
		return Decision{RetryAfter: wait, ResetAfter: wait}, nil
	}
	gen := b.preblock.generation()
	bound := b.cfg.Timeout
	if inTx {
		// The server bounds the wait (lock_timeout) and keeps the caller's
		// connection; this deadline only catches a server gone silent.
		bound += txClientTimeoutMargin
	}
	ctx, cancel := context.WithTimeoutCause(ctx, bound, ErrTimeout)
	defer cancel()
	d, err := fn(ctx)
	if err != nil {
		return Decision{}, b.wrap(ctx, err)
	}
	if !inTx && !d.estimated {
		// The statement ran after sent, so sent+ResetAfter is no later
		// than the end of the cooldown on the database clock.
		b.preblock.block(key, sent.Add(d.ResetAfter), gen)
	}
	return d, nil
}

// txClientTimeoutMargin is how much longer than Timeout AllowTx waits for
// the server before giving up on the connection.
const txClientTimeoutMargin = time.Second

// wrap adds the strategy name and, when the limiter's own timeout fired,
// ErrTimeout (the pgx error then only says the context was cancelled).
func (b *base) wrap(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrTimeout) && !errors.Is(err, ErrTimeout) {
		return fmt.Errorf("%w (%s, after %s): %w", ErrTimeout, b.cfg.Strategy, b.cfg.Timeout, err)
	}
	return fmt.Errorf("pglimit: %s: %w", b.cfg.Strategy, err)
}

// admitted builds the decision for an admission whose cooldown ends in
// remaining, measured on the database clock.
func admitted(remaining time.Duration) Decision {
	return Decision{Allowed: true, ResetAfter: remaining}
}

// unknown stands for a cooldown end the statement could not read.
const unknown = time.Duration(-1)

// refused builds the decision for a refusal whose cooldown ends in
// remaining. An unknown or already passed end (a concurrent decision the
// statement's snapshot could not see) becomes the whole cooldown: an upper
// bound, marked as an estimate so the pre-block does not trust it.
func (b *base) refused(remaining time.Duration) Decision {
	if remaining <= 0 {
		return Decision{RetryAfter: b.cfg.Cooldown, ResetAfter: b.cfg.Cooldown, estimated: true}
	}
	return Decision{RetryAfter: remaining, ResetAfter: remaining}
}

// reset deletes every row of key in the limiter's namespace.
func (b *base) reset(ctx context.Context, query, key string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, b.cfg.Timeout, ErrTimeout)
	defer cancel()
	if _, err := b.db.Exec(ctx, query, b.args.namespace, key); err != nil {
		return b.wrap(ctx, fmt.Errorf("reset: %w", err))
	}
	b.preblock.forget(key)
	return nil
}

// pgCode returns the SQLSTATE of err, or "" if it is not a server error.
func pgCode(err error) string {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pgErr.Code
	}
	return ""
}
