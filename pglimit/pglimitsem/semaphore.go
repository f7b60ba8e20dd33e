package pglimitsem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/internal/lockid"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// ErrSlotLost reports a [Slot] that is no longer held when its holder
// releases or extends it: it was released already, or its lease ended
// (and another caller may hold it now), or it was never acquired.
// Releasing such a slot changes nothing.
var ErrSlotLost = errors.New("pglimitsem: the slot is not held")

// Config configures a [Semaphore]. Limit is required; every other
// zero field takes its default.
type Config struct {
	// Schema holds the slots table (pglimit_slots, which [pglimit.Migrate]
	// creates). Defaults to "public".
	Schema string

	// Namespace separates semaphores that share the table. Same rules as
	// a key. Defaults to "default".
	Namespace string

	// Slots is how many slots a key has: at most Slots requests of a key
	// in flight at once. From 1 to 10,000.
	Slots int

	// TTL is a slot's lease: a slot whose holder neither releases nor
	// extends it within TTL returns by itself, so that a holder that died
	// (a killed process, a lost connection) does not keep it. From 1s to
	// 366 days. Defaults to 1 minute.
	TTL time.Duration

	// Timeout bounds each call on top of the caller's context; past it the
	// call fails with [pglimit.ErrTimeout]. Defaults to 2s.
	Timeout time.Duration
}

// Semaphore limits how many requests of a key are in flight at once, across
// every instance of the application: at most Limit slots of a key are held
// at a time. A caller acquires a slot before the work and releases it
// after; a slot that is not released returns when its lease ends. It is
// for work whose cost is its duration, such as "at most 2 exports running
// per user", where a rate or cooldown says too little.
//
// A slot is a row of pglimit_slots. Acquiring takes a free one, or a new
// slot number below Limit, in one statement that skips slots other
// acquirers hold locked, so that N+k concurrent acquirers of a key with no
// slot held get exactly N. A refusal writes nothing.
type Semaphore struct {
	db  pglimit.DB
	cfg Config
	ttl int64 // µs
	// lockSeed seeds the hash of a slot's advisory lock, one per table.
	lockSeed int64
	stmts    struct{ acquire, extend, release string }
}

// Slot is the outcome of an acquisition. The holder passes it back to
// [Semaphore.Release] and [Semaphore.Extend].
type Slot struct {
	// Acquired reports whether the slot was acquired.
	Acquired bool

	// Held is how many slots of the key were held right after the call,
	// counting this one when it was acquired.
	Held int

	// RetryAfter is, for a refusal, the time until the first of the
	// held slots' leases ends: an upper bound on the wait, since a holder
	// may release its slot sooner. Zero when Acquired.
	RetryAfter time.Duration

	// ExpiresIn is, for an acquired slot, the time until its lease ends
	// unless it is extended or released.
	ExpiresIn time.Duration

	key    string
	slot   int32
	holder string // a uuid, as text
}

// New returns a semaphore of cfg over db.
func New(db pglimit.DB, cfg *Config) (*Semaphore, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", pglimit.ErrInvalidConfig)
	}
	if cfg == nil {
		return nil, fmt.Errorf("%w: Config is nil; Limit is required", pglimit.ErrInvalidConfig)
	}
	c := *cfg
	c.Schema = cmp.Or(c.Schema, defaultSchema)
	if err := pglimit.ValidateIdentifier(c.Schema); err != nil {
		return nil, fmt.Errorf("%w: Schema: %w", pglimit.ErrInvalidConfig, err)
	}
	c.Namespace = cmp.Or(c.Namespace, defaultNamespace)
	if err := pglimit.ValidateKey(c.Namespace); err != nil {
		return nil, fmt.Errorf("%w: Namespace: %w", pglimit.ErrInvalidConfig, err)
	}
	if c.Slots < 1 || c.Slots > maxSlots {
		return nil, fmt.Errorf("%w: Slots must be from 1 to %d, got %d", pglimit.ErrInvalidConfig, maxSlots, c.Slots)
	}
	c.TTL = cmp.Or(c.TTL, defaultSlotTTL)
	if c.TTL < time.Second || c.TTL > maxTTL {
		return nil, fmt.Errorf("%w: TTL must be from 1s to %s, got %s", pglimit.ErrInvalidConfig, maxTTL, c.TTL)
	}
	if c.Timeout < 0 {
		return nil, fmt.Errorf("%w: Timeout must not be negative, got %s", pglimit.ErrInvalidConfig, c.Timeout)
	}
	c.Timeout = cmp.Or(c.Timeout, defaultTimeout)
	s := &Semaphore{db: db, cfg: c, ttl: c.TTL.Microseconds()}
	table := pgx.Identifier{c.Schema, slotsTable}.Sanitize()
	s.lockSeed = lockid.SlotSeed(table)
	args := queries.Args{"table": table}
	s.stmts.acquire = queries.Text("slots.acquire", args)
	s.stmts.extend = queries.Text("slots.extend", args)
	s.stmts.release = queries.Text("slots.release", args)
	return s, nil
}

const (
	slotsTable     = "pglimit_slots"
	maxSlots       = 10_000
	defaultSlotTTL = time.Minute

	// As a limiter's: the defaults of Config, the longest TTL (366 days),
	// and the attempts after a lost race.
	defaultSchema    = "public"
	defaultNamespace = "default"
	defaultTimeout   = 2 * time.Second
	maxTTL           = 366 * 24 * time.Hour
	maxAttempts      = 3
)

// Acquire takes a slot of key if fewer than Limit are held, for TTL. A
// refusal writes nothing; its Slot says how many are held and when the
// first lease ends.
func (s *Semaphore) Acquire(ctx context.Context, key string) (Slot, error) {
	return s.acquire(ctx, key, func(ctx context.Context, scan func(pgx.Row) error) error {
		return scan(s.db.QueryRow(ctx, s.stmts.acquire, s.args(key)...))
	})
}

// AcquireTx is Acquire inside the caller's transaction tx (a pgx.Tx, or a
// database/sql one through pglimitsql.Tx): the slot is taken only if tx
// commits, and other acquirers skip it while tx is open. Like AllowTx, it
// runs in a savepoint and never aborts tx: a lost race is a refusal.
// Release the slot after the work, in tx or later.
func (s *Semaphore) AcquireTx(ctx context.Context, tx pglimit.DB, key string) (Slot, error) {
	return s.acquire(ctx, key, func(ctx context.Context, scan func(pgx.Row) error) error {
		return pgtx.InSavepoint(ctx, tx, s.cfg.Timeout, s.stmts.acquire, s.args(key), scan)
	})
}

func (s *Semaphore) args(key string) []any {
	return []any{s.cfg.Namespace, key, s.cfg.Slots, s.ttl, s.lockSeed}
}

func (s *Semaphore) acquire(ctx context.Context, key string, run func(context.Context, func(pgx.Row) error) error) (Slot, error) {
	if err := pglimit.ValidateKey(key); err != nil {
		return Slot{}, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, s.cfg.Timeout, pglimit.ErrTimeout)
	defer cancel()
	// An attempt that finds no slot but fewer than Limit held either met
	// acquisitions in flight, which will hold the rest, or tried a slot
	// number that an acquisition committed after its snapshot; the next
	// attempt sees that one. Past the attempts, the slots it could not
	// see are counted held.
	out := Slot{Held: s.cfg.Slots, RetryAfter: s.cfg.TTL}
	for range min(s.cfg.Slots, 16) + maxAttempts {
		var (
			slot          *int32
			holder        *string
			end, firstEnd *int64
			held          int64
			now           int64
		)
		err := run(ctx, func(row pgx.Row) error {
			return row.Scan(&slot, &holder, &end, &held, &firstEnd, &now)
		})
		switch code := pgtx.Code(err); {
		case code == pgtx.CodeSerializationFailure:
			// At REPEATABLE READ or above in a caller's transaction, a
			// slot changed after its snapshot: another acquirer won it.
			return Slot{Held: s.cfg.Slots, RetryAfter: s.cfg.TTL}, nil
		case code == pgtx.CodeLockNotAvailable:
			return Slot{}, fmt.Errorf("%w (semaphore, lock_timeout %s): %w", pglimit.ErrTimeout, s.cfg.Timeout, err)
		case err != nil:
			return Slot{}, s.wrap(ctx, err)
		case slot != nil:
			return Slot{Acquired: true, Held: int(held) + 1, ExpiresIn: time.Duration(*end-now) * time.Microsecond, key: key, slot: *slot, holder: *holder}, nil
		}
		if int(held) >= s.cfg.Slots {
			return Slot{Held: int(held), RetryAfter: time.Duration(*firstEnd-now) * time.Microsecond}, nil
		}
	}
	return out, nil
}

// Extend renews the lease of a slot the caller holds, for another TTL
// from now, and returns the slot with its new ExpiresIn. It fails with
// [ErrSlotLost] if the slot is no longer held.
func (s *Semaphore) Extend(ctx context.Context, slot Slot) (Slot, error) {
	if !slot.Acquired {
		return slot, fmt.Errorf("%w: it was never acquired", ErrSlotLost)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, s.cfg.Timeout, pglimit.ErrTimeout)
	defer cancel()
	var left int64
	err := s.db.QueryRow(ctx, s.stmts.extend, s.cfg.Namespace, slot.key, slot.slot, slot.holder, s.ttl).Scan(&left)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return slot, fmt.Errorf("%w: its lease ended, or it was released", ErrSlotLost)
	case err != nil:
		return slot, s.wrap(ctx, err)
	}
	slot.ExpiresIn = time.Duration(left) * time.Microsecond
	return slot, nil
}

// Release frees a slot the caller holds. Releasing a slot twice, or after
// its lease ended, changes nothing and reports [ErrSlotLost]: the slot is
// never counted free twice, nor taken from a caller who acquired it since.
func (s *Semaphore) Release(ctx context.Context, slot Slot) error {
	if !slot.Acquired {
		return fmt.Errorf("%w: it was never acquired", ErrSlotLost)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, s.cfg.Timeout, pglimit.ErrTimeout)
	defer cancel()
	tag, err := s.db.Exec(ctx, s.stmts.release, s.cfg.Namespace, slot.key, slot.slot, slot.holder)
	switch {
	case err != nil:
		return s.wrap(ctx, err)
	case tag.RowsAffected() == 0:
		return fmt.Errorf("%w: its lease ended, or it was released already", ErrSlotLost)
	}
	return nil
}

// Slots returns how many slots a key has: how many of its requests may be
// in flight at once.
func (s *Semaphore) Slots() int { return s.cfg.Slots }

// wrap adds pglimit.ErrTimeout when the semaphore's own timeout fired, and
// pglimit.ErrReadOnly when the server could not write.
func (s *Semaphore) wrap(ctx context.Context, err error) error {
	switch {
	case errors.Is(context.Cause(ctx), pglimit.ErrTimeout) && !errors.Is(err, pglimit.ErrTimeout):
		return fmt.Errorf("%w (semaphore, after %s): %w", pglimit.ErrTimeout, s.cfg.Timeout, err)
	case pgtx.ReadOnly(err):
		return fmt.Errorf("%w (semaphore): %w", pglimit.ErrReadOnly, err)
	}
	return fmt.Errorf("pglimit: semaphore: %w", err)
}
