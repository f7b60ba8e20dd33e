package pglimit

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Strategy selects the SQL a limiter uses. All strategies keep the same
// promises; they differ in cost under contention and in table growth.
type Strategy string

const (
	// Upsert updates the key's row only when the request fits its limits
	// (an UPDATE with that guard), or inserts it for a key never seen. One round
	// trip, one row per key.
	Upsert Strategy = "upsert"

	// NoWait locks the key's row with SELECT ... FOR UPDATE, waiting at
	// most 20 ms, then updates or inserts it, and treats a row locked by
	// someone else for longer as a refusal. One round trip, one row per
	// key.
	NoWait Strategy = "nowait"

	// Range inserts the cooldown as a tstzrange into a table whose
	// exclusion constraint forbids overlaps. One round trip, one row per
	// admission: it needs the cleanup job.
	Range Strategy = "range"
)

// Strategies returns every strategy, in the order reports show them. The
// slice is the caller's.
func Strategies() []Strategy { return []Strategy{Upsert, NoWait, Range} }

// ParseStrategy returns the strategy named s (case-insensitive).
func ParseStrategy(s string) (Strategy, error) {
	st := Strategy(strings.ToLower(strings.TrimSpace(s)))
	switch st {
	case Upsert, NoWait, Range:
		return st, nil
	}
	return "", fmt.Errorf("%w: Strategy %q is not one of upsert, nowait, range", ErrInvalidConfig, s)
}

// Config configures a limiter. A nil Config is invalid because a limit has
// no sensible default: set Cooldown or Limits. Every other zero field takes
// its default.
type Config struct {
	// Strategy selects the SQL. Defaults to [Upsert].
	Strategy Strategy

	// Cooldown is the least time between two admissions of the same key:
	// shorthand for Limits {{Name: "cooldown", Rate: 1, Period: Cooldown,
	// Burst: 1}}. Set Cooldown or Limits, not both; must be positive, at
	// most 366 days: 0 is unset, so it is refused unless Limits are set.
	Cooldown time.Duration

	// Limits are the limits every key must satisfy all at once, at most
	// [MaxLimits]. Range supports only a cooldown: one GCRA limit with
	// Burst 1.
	Limits []Limit

	// Namespace separates limiters that share a table (one per endpoint or
	// limit): a key's state belongs to its namespace. Same rules as a key.
	// Limiters that name the same namespace share state whatever their
	// limits, so give each limit its own, and keep it when the limits
	// change: that is how a key keeps what it has used across a rolling
	// deploy (docs/limits.md, "Namespaces, and changing limits").
	//
	// Unset, it is derived from the limits: "default-" and 12 hex digits
	// of a hash of every limit's algorithm, rate, period, burst, calendar,
	// time zone and name, in order ([Policy] reports it). Two limiters
	// without a Namespace then share state exactly when they enforce the
	// same limits, and any change of the limits starts every key afresh.
	Namespace string

	// Schema holds the limiter's table. A plain identifier. Defaults to
	// "public".
	Schema string

	// Table is the limiter's table. A plain identifier, of the shape the
	// migrations create for the strategy: the first decision checks it,
	// and a Schema and Table that name no such table make it fail with
	// [ErrInvalidConfig]. Defaults to "pglimit_upsert",
	// "pglimit_nowait" or "pglimit_range".
	//
	// The migrations also create "pglimit_upsert_unlogged" and
	// "pglimit_nowait_unlogged", UNLOGGED tables for Upsert and NoWait: an
	// admission writes no WAL, so it waits for no WAL flush. The price: a
	// database crash or immediate shutdown empties them, so every key
	// starts afresh, and a replica has no copy. Like Redis without
	// persistence. List them in pglimitclean.Config.Tables to clean them.
	// (Admissions on every Upsert and NoWait table are HOT updates: no
	// index covers expires_at.)
	Table string

	// Timeout bounds each decision on top of the caller's context; past it
	// the decision fails with [ErrTimeout]. Defaults to 2s.
	Timeout time.Duration

	// Shadow runs the limits without enforcing them, to roll a new limit
	// out safely: every decision the limits refuse is returned admitted,
	// with [Decision.Shadow] set and its Violated, RetryAfter and
	// ResetAfter telling what enforcing would have said. Such a request
	// consumes nothing, so the key's state is what enforcement would have
	// left, and turning Shadow off enforces from the state observed.
	Shadow bool

	// Overrides makes the limiter read per-key limits from
	// pglimit_overrides on every decision: a key with a row there gets its
	// own rate and burst for the limits the row names ([SetKeyLimits], or
	// plain SQL), the others the limiter's. A change takes effect at the
	// next decision on every instance; nothing caches it. A key's costs
	// are checked against its own limits, and a row they cannot use makes
	// its decisions fail with [ErrInvalidConfig]. Upsert and NoWait
	// only, without PreBlockSize, and with a Namespace: the rows belong to
	// it. The key's statement is the general one, neither batched nor
	// leased (docs/limits.md).
	Overrides bool

	// Fallback, when set, makes Allow and AllowN decide in process while
	// the database is unavailable, instead of failing. Defaults to nil:
	// such calls fail, and the caller's policy (pglimithttp.Config.OnError)
	// applies.
	Fallback *Fallback

	// AsyncCommit commits the limiter's own writes with synchronous_commit
	// off, so an admission does not wait for its WAL flush: it pays most
	// where flushes are slow (docs/throughput.md measures it). The setting
	// is local to the limiter's statement (never the session, never the application's
	// other queries on a shared pool) and is not applied by AllowTx, where
	// the caller's commit decides. The cost: a database crash may lose the
	// last fraction of a second of admissions, so a key admitted just
	// before the crash may be admitted once more, early, after it; and an
	// admission does not wait for a synchronous standby either, so a
	// failover may lose it too (docs/operations.md). Defaults to false.
	AsyncCommit bool

	// PreBlockSize, when positive, turns on the local pre-block: after the
	// database has decided that a key has no unit left until T, this
	// process refuses the key until T without a round trip, remembering at
	// most PreBlockSize keys (a full cache forgets keys, which only costs
	// round trips). It never refuses past a time the database reported. A
	// Reset through this limiter clears its own entry at once; a Reset made
	// by another instance reaches this one through Invalidator, or without
	// one only when the remembered time comes: at most one full burst (a
	// cooldown) later. Only for a single GCRA limit, a cooldown among them.
	// Defaults to 0 (off).
	PreBlockSize int

	// Invalidator, when set, carries every Reset of the limiter's keys,
	// from any instance, to its pre-block and its leases within
	// milliseconds, and keeps the pre-block from answering while it is not
	// listening (see [Invalidator]). Defaults to nil: Resets of other
	// instances reach the pre-block when the time it remembers comes, and a lease
	// when its units' time has passed (docs/limits.md, "Leases").
	Invalidator *Invalidator

	// Observer, when set, sees the start and end of every decision, and
	// the batches and lease give-backs it asks for: the hook metrics and
	// tracing plug into (pglimitprom's Metrics, pglimitotel's Observer).
	// Defaults to nil: no decision pays for observation beyond a nil
	// check.
	Observer Observer

	// IDRetention is how long an admitted decision id ([WithID]) is kept:
	// a retry with the id within it returns the first decision and charges
	// nothing; after it, once the cleanup job has deleted the id's row,
	// the id is decided afresh. Between [MinIDRetention] and
	// [MaxIDRetention]; defaults to [DefaultIDRetention] (a day).
	IDRetention time.Duration

	// recordRetry, a test lever, is how soon a record of the policy that
	// failed is tried again (policies.go); zero means recordRetry.
	recordRetry time.Duration
}

const (
	derivedNamespacePrefix = "default-"
	defaultSchema          = "public"
	defaultTimeout         = 2 * time.Second
)

var defaultTables = map[Strategy]string{
	Upsert: "pglimit_upsert",
	NoWait: "pglimit_nowait",
	Range:  "pglimit_range",
}

func (c *Config) withDefaults() (Config, error) {
	if c == nil {
		return Config{}, fmt.Errorf("%w: Config is nil; Cooldown or Limits is required", ErrInvalidConfig)
	}
	out := *c
	out.Strategy = cmp.Or(out.Strategy, Upsert)
	if _, err := ParseStrategy(string(out.Strategy)); err != nil {
		return Config{}, err
	}
	limits, err := out.limits()
	if err != nil {
		return Config{}, err
	}
	out.Limits = limits
	if out.Namespace == "" && out.Overrides {
		// The keys' own limits are rows of the namespace that an operator
		// wrote: under a derived namespace the next change of the limits
		// would drop them all, silently.
		return Config{}, fmt.Errorf("%w: Overrides needs a Namespace: per-key limits are kept by namespace, and one derived from the limits changes with them", ErrInvalidConfig)
	}
	if out.Namespace == "" {
		out.Namespace = derivedNamespace(out.Limits)
	}
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
	out.IDRetention = cmp.Or(out.IDRetention, DefaultIDRetention)
	if out.IDRetention < MinIDRetention || out.IDRetention > MaxIDRetention {
		return Config{}, fmt.Errorf("%w: IDRetention must be between %s and %s, got %s", ErrInvalidConfig, MinIDRetention, MaxIDRetention, out.IDRetention)
	}
	if out.PreBlockSize < 0 {
		return Config{}, fmt.Errorf("%w: PreBlockSize must not be negative, got %d", ErrInvalidConfig, out.PreBlockSize)
	}
	if out.PreBlockSize > 0 && (len(out.Limits) != 1 || out.Limits[0].Algorithm != GCRA) {
		return Config{}, fmt.Errorf("%w: PreBlockSize needs a single GCRA limit (a cooldown, say)", ErrInvalidConfig)
	}
	if out.Invalidator != nil && out.PreBlockSize == 0 && !out.leases() {
		return Config{}, fmt.Errorf("%w: Invalidator applies only with a pre-block (PreBlockSize) or to a limit that leases (docs/limits.md)", ErrInvalidConfig)
	}
	if out.Overrides && (out.Strategy == Range || out.PreBlockSize > 0) {
		return Config{}, fmt.Errorf("%w: Overrides needs Upsert or NoWait, and no PreBlockSize", ErrInvalidConfig)
	}
	if out.Strategy == Range && !isCooldown(out.Limits) {
		return Config{}, fmt.Errorf("%w: Range supports only a cooldown (one GCRA limit with Burst 1); use Upsert or NoWait for other limits", ErrInvalidConfig)
	}
	return out, nil
}

// limits returns the limits c sets, validated and with defaults filled in.
func (c *Config) limits() ([]Limit, error) {
	switch {
	case c.Cooldown != 0 && len(c.Limits) > 0:
		return nil, fmt.Errorf("%w: set Cooldown or Limits, not both", ErrInvalidConfig)
	case c.Cooldown < 0 || c.Cooldown > maxPeriod:
		return nil, fmt.Errorf("%w: Cooldown must be positive and at most %s, got %s", ErrInvalidConfig, maxPeriod, c.Cooldown)
	case c.Cooldown > 0:
		return []Limit{{Name: "cooldown", Rate: 1, Period: c.Cooldown, Burst: 1}}, nil
	case len(c.Limits) == 0:
		// A zero Cooldown is an unset one: the message serves both.
		return nil, fmt.Errorf("%w: Cooldown or Limits is required: Cooldown must be positive and at most %s, got %s", ErrInvalidConfig, maxPeriod, c.Cooldown)
	case len(c.Limits) > MaxLimits:
		return nil, fmt.Errorf("%w: %d Limits, more than the maximum of %d", ErrInvalidConfig, len(c.Limits), MaxLimits)
	}
	out := make([]Limit, len(c.Limits))
	for i, l := range c.Limits {
		var err error
		if out[i], err = l.withDefaults(i); err != nil {
			return nil, err
		}
		if j := slices.IndexFunc(out[:i], func(o Limit) bool { return o.Name == out[i].Name }); j >= 0 {
			return nil, fmt.Errorf("%w: Limits[%d] and Limits[%d] are both named %q", ErrInvalidConfig, j, i, out[i].Name)
		}
	}
	return out, nil
}

// derivedNamespace is the namespace of a limiter that names none: a
// fingerprint of what its rows mean, the limits with defaults filled in.
// The strategy, schema and table are left out, as they keep state apart
// already, and so is every option that leaves a row's meaning alone
// (Timeout, Shadow, Overrides, Fallback, ...). Each field is written with
// its length, so that no two lists of limits write the same bytes. The
// value is part of the deployed protocol: instances of different releases
// must derive the same one (TestNamespaceDerivedGolden).
func derivedNamespace(limits []Limit) string {
	h := sha256.New()
	field := func(s string) { fmt.Fprintf(h, "%d:%s;", len(s), s) }
	field("pglimit.limits.v1")
	for _, l := range limits {
		field(l.Algorithm.String())
		field(strconv.Itoa(l.Rate))
		field(strconv.FormatInt(int64(l.Period), 10))
		field(strconv.Itoa(l.Burst))
		field(l.Calendar)
		field(l.TimeZone)
		field(l.Name)
	}
	return derivedNamespacePrefix + hex.EncodeToString(h.Sum(nil)[:6])
}

// isCooldown reports whether limits are one GCRA limit with burst 1: a
// cooldown of Period/Rate.
func isCooldown(limits []Limit) bool {
	return len(limits) == 1 && limits[0].Algorithm == GCRA && limits[0].Burst == 1
}

// ValidateKey reports whether key can be used as a key or namespace.
//
// It must be non-empty, at most [MaxKeyLength] bytes, valid UTF-8 and free
// of NUL bytes (which PostgreSQL text cannot hold). The error wraps
// [ErrInvalidKey].
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
// identifier of at most 63 bytes (PostgreSQL's limit).
//
// That is a letter or underscore, then letters, digits or underscores. Such
// a name means the same quoted or not, so schemas made by hand and by
// migrations agree.
func ValidateIdentifier(name string) error {
	if !identifierRE.MatchString(name) {
		return fmt.Errorf("%q is not a plain identifier (lower-case letters, digits and _, at most 63 bytes, not starting with a digit)", name)
	}
	return nil
}
