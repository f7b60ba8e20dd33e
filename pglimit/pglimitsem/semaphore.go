package pglimitsem

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/internal/fault"
	"github.com/pglimit/cooldown/pglimit/internal/listen"
	"github.com/pglimit/cooldown/pglimit/internal/lockid"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// ErrSlotLost reports a [Slot] that is no longer held when its holder
// releases or extends it: it was released already, or its lease ended
// (and another caller may hold it now), or it was never acquired.
// Releasing such a slot changes nothing.
var ErrSlotLost = errors.New("pglimitsem: the slot is not held")

// Config configures a [Semaphore]. Slots is required; every other
// zero field takes its default.
type Config struct {
	// Schema holds the slots table (pglimit_slots, which [pglimit.Migrate]
	// creates). Defaults to "public".
	Schema string

	// Namespace separates semaphores that share the table: a key's slots
	// belong to its namespace. Same rules as a key. Semaphores that name
	// the same namespace share their slots whatever their Slots, so give
	// each its own, and keep it when Slots changes (docs/limits.md).
	//
	// Unset, it is derived from Slots: "default-" and 12 hex digits of a
	// hash of it ([Call] reports it). Two semaphores without a Namespace
	// then share slots exactly when they have as many, and a change of
	// Slots starts every key with none held.
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

	// WaitPoll is how often a caller of [Semaphore.Wait] asks again for a
	// slot while all are held, when no release wakes it sooner (one in its
	// own process, or, with Listen, one it hears of). From 1ms to 1
	// minute. Defaults to 50ms.
	WaitPoll time.Duration

	// FlowQueue bounds the queue of each flow of a key for
	// [Semaphore.WaitFlow]: a waiter that finds as many live places of its
	// flow in the key's queue is refused with [ErrQueueFull]. Waiters that
	// join at the same instant may each pass the bound, by at most their
	// number. From 1 to 100,000. Defaults to 1,000.
	FlowQueue int

	// Levels are the priority levels of [Semaphore.AcquireLevel] and
	// [Semaphore.WaitLevel], each
	// with a guaranteed share of every key's slots, what of it the others
	// may borrow, and a ceiling: see [Level]. At most 16, whose Min add up
	// to at most Slots. Defaults to none.
	Levels []Level

	// Listen, when set, is how to open a session on which the semaphore
	// hears (LISTEN) the releases of other instances, so that its callers
	// of [Semaphore.Wait] take a freed slot within milliseconds rather
	// than at their next poll. The semaphore opens it at its first Wait
	// and keeps it, one connection outside db's pool, until
	// [Semaphore.Close], which a semaphore with Listen needs. The session
	// proves itself alive every second and reconnects after a failure
	// (a pause of 50ms, doubling to 5s); meanwhile waiters poll every
	// WaitPoll. It must reach the server itself, as the Invalidator's
	// does: behind a PgBouncer in transaction pooling mode a LISTEN hears
	// nothing, and leaves the server connection it ran on listening for
	// other clients. For a *pgxpool.Pool that reaches the server
	// directly, pool.Config().ConnConfig. The semaphore uses a copy.
	//
	// A semaphore with Listen also notifies: its Release of a slot of a
	// key that has waiters (in any instance) tells the listeners, when the
	// release commits. Set it on every instance, then: a release without
	// it notifies no one, and waiters elsewhere take the slot at their
	// next poll. Looking for waiters costs each release one more index
	// probe.
	//
	// Defaults to nil: waiters hear only this process's releases, and
	// poll.
	Listen *pgx.ConnConfig

	// Observe, when set, is called once after every Acquire and AcquireTx
	// with what happened, on the caller's goroutine: a hook for metrics
	// (pglimitprom's Metrics.ObserveSemaphore counts each call as a
	// decision). It must not block. Defaults to nil.
	Observe func(ctx context.Context, c Call)
}

// Call is one Acquire or AcquireTx as it ended, for [Config.Observe].
type Call struct {
	Namespace string // the semaphore's
	Key       string
	Slot      Slot  // the outcome; zero when Err is set
	Err       error // the call's error, if any
	Took      time.Duration
}

// Semaphore limits how many requests of a key are in flight at once, across
// every instance of the application: at most Slots slots of a key are held
// at a time. A caller acquires a slot before the work and releases it
// after; a slot that is not released returns when its lease ends. It is
// for work whose cost is its duration, such as "at most 2 exports running
// per user", where a rate or cooldown says too little.
//
// A slot is a row of pglimit_slots. Acquiring takes a free one, or a new
// slot number below Slots, in one statement that skips slots other
// acquirers hold locked, so that N+k concurrent acquirers of a key with no
// slot held get exactly N. A refusal writes nothing.
//
// # Bounds
//
// Every call returns by its context's deadline or the semaphore's Timeout,
// whichever comes first, plus the time to hear the server's error or to
// give up on the connection (the tests allow 500 ms), even while another
// transaction holds the slot's row or the whole table locked. AcquireTx
// and ReleaseTx leave the wait to the server (lock_timeout), which keeps
// the caller's transaction usable, and give up on a server that does not
// answer one second later. A wait the server ends, by lock_timeout or
// statement_timeout (SQLSTATE 55P03 or 57014, from the semaphore's own
// setting or the role's), is [pglimit.ErrTimeout]; a server that cannot
// write is [pglimit.ErrReadOnly]; an invalid key is [pglimit.ErrInvalidKey]
// and a slot never acquired [ErrSlotLost], and neither reaches the
// database. The Semaphore keeps in memory one number (the average hold,
// for [Slot.RetryAfter]), whatever the number of keys, and for each key
// with a caller of [Semaphore.Wait] in this process a wake channel,
// dropped when the key's last caller returns; with [Config.Listen], also
// one connection and one goroutine, from its first Wait until
// [Semaphore.Close].
type Semaphore struct {
	db  pglimit.DB
	cfg Config
	ttl int64 // µs
	// lockSeed seeds the hash of a slot's advisory lock, one per table.
	lockSeed int64
	stmts    struct {
		acquire, extend, release, wait, enqueue, leave string
		// leaveJoined is leave for a waiter whose join failed unseen.
		leaveJoined string
		// waitFlow and enqueueFlow are wait and enqueue for a waiter of a
		// flow (WaitFlow); takeFlow its first try, before it joins, and
		// joinFlow its join and first try in turn, in one statement.
		waitFlow, enqueueFlow, takeFlow, joinFlow string
		// setWeight and resetWeight set and reset a flow's weight.
		setWeight, resetWeight string
		// acquireLevel is acquire for a priority level (AcquireLevel);
		// waitLevel and enqueueLevel, wait and enqueue for a waiter of one
		// (WaitLevel); takeLevel its first try, before it joins.
		acquireLevel, waitLevel, enqueueLevel, takeLevel string
	}
	// hold is the average time from an acquisition to its release seen
	// in this process, in ns; 0 before the first release.
	hold atomic.Int64

	// levels is Config.Levels, checked, for AcquireLevel.
	levels levels

	// leaving counts the goroutines under way that take joins cut off
	// out of the queue (joinedUnseen), each within Timeout.
	leaving atomic.Int64

	// channel is the namespace's notification channel (channelOf);
	// listen, Config.Listen's copy for the listening session, or nil.
	channel string
	listen  *pgx.ConnConfig

	// wakeMu guards wake, listener and closed. wake is, for each key with
	// a caller of Wait in this process, by its tag (tagOf), a channel that
	// a Release of the key closes, in this process or, heard by the
	// listener, in another. An entry lives while a caller waits for the
	// key; the map, while any does. listener runs from the first Wait of a
	// semaphore with Listen until Close.
	wakeMu   sync.Mutex
	wake     map[string]*waking
	listener *listener
	closed   bool
}

// waking is a key's callers of Wait in this process, and the channel that
// wakes them.
type waking struct {
	callers int
	ch      chan struct{}
}

// Slot is the outcome of an acquisition. The holder passes it back to
// [Semaphore.Release] and [Semaphore.Extend].
type Slot struct {
	// Acquired reports whether the slot was acquired.
	Acquired bool

	// Held is how many slots of the key were held right after the call,
	// counting this one when it was acquired.
	Held int

	// RetryAfter is, for a refusal, a hint of when a slot may be free:
	// the average time slots were held before their release
	// ([Semaphore.HoldTime]), at most the time until the first held lease
	// ends. Before this process has seen a release, it is that lease's
	// end. It is an estimate, not a promise: a holder may release sooner,
	// or extend its lease and hold longer. Zero when Acquired.
	RetryAfter time.Duration

	// ExpiresIn is, for an acquired slot, the time until its lease ends
	// unless it is extended or released.
	ExpiresIn time.Duration

	key      string
	slot     int32
	holder   string    // a uuid, as text
	acquired time.Time // on this process's clock, for the average hold
}

// New returns a semaphore of cfg over db.
func New(db pglimit.DB, cfg *Config) (*Semaphore, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", pglimit.ErrInvalidConfig)
	}
	if cfg == nil {
		return nil, fmt.Errorf("%w: Config is nil; Slots is required", pglimit.ErrInvalidConfig)
	}
	c := *cfg
	c.Schema = cmp.Or(c.Schema, defaultSchema)
	if err := pglimit.ValidateIdentifier(c.Schema); err != nil {
		return nil, fmt.Errorf("%w: Schema: %w", pglimit.ErrInvalidConfig, err)
	}
	if c.Slots < 1 || c.Slots > maxSlots {
		return nil, fmt.Errorf("%w: Slots must be from 1 to %d, got %d", pglimit.ErrInvalidConfig, maxSlots, c.Slots)
	}
	if c.Namespace == "" {
		c.Namespace = derivedNamespace(c.Slots)
	}
	if err := pglimit.ValidateKey(c.Namespace); err != nil {
		return nil, fmt.Errorf("%w: Namespace: %w", pglimit.ErrInvalidConfig, err)
	}
	c.TTL = cmp.Or(c.TTL, defaultSlotTTL)
	if c.TTL < time.Second || c.TTL > maxTTL {
		return nil, fmt.Errorf("%w: TTL must be from 1s to %s, got %s", pglimit.ErrInvalidConfig, maxTTL, c.TTL)
	}
	c.FlowQueue = cmp.Or(c.FlowQueue, defaultFlowQueue)
	if c.FlowQueue < 1 || c.FlowQueue > maxFlowQueue {
		return nil, fmt.Errorf("%w: FlowQueue must be from 1 to %d, got %d", pglimit.ErrInvalidConfig, maxFlowQueue, c.FlowQueue)
	}
	if c.Timeout < 0 {
		return nil, fmt.Errorf("%w: Timeout must not be negative, got %s", pglimit.ErrInvalidConfig, c.Timeout)
	}
	c.Timeout = cmp.Or(c.Timeout, defaultTimeout)
	c.WaitPoll = cmp.Or(c.WaitPoll, defaultWaitPoll)
	if c.WaitPoll < time.Millisecond || c.WaitPoll > time.Minute {
		return nil, fmt.Errorf("%w: WaitPoll must be from 1ms to 1m, got %s", pglimit.ErrInvalidConfig, c.WaitPoll)
	}
	levels, err := newLevels(c.Levels, c.Slots)
	if err != nil {
		return nil, err
	}
	s := &Semaphore{db: db, cfg: c, ttl: c.TTL.Microseconds(), levels: levels}
	table := pgx.Identifier{c.Schema, slotsTable}.Sanitize()
	waiters := pgx.Identifier{c.Schema, waitersTable}.Sanitize()
	flows := pgx.Identifier{c.Schema, flowsTable}.Sanitize()
	s.lockSeed = lockid.SlotSeed(table)
	s.channel = channelOf(table, c.Namespace)
	args := queries.Args{"table": table, "waiters": waiters, "channel": s.channel, "tag_len": strconv.Itoa(tagLen),
		"queue": "", "turn": "", "turn_first": "", "dequeue": "", "waiting": "",
		"set_extra": "", "extra_col": "", "extra_val": "", "flows": flows}
	s.stmts.acquire = queries.Text("slots.acquire", args)
	s.stmts.extend = queries.Text("slots.extend", args)
	s.stmts.release = queries.Text("slots.release", args)
	if c.Listen != nil {
		s.stmts.release = queries.Text("slots.release_notify", args)
		s.listen = listen.SessionConfig(c.Listen)
	}
	s.stmts.enqueue = queries.Text("slots.enqueue", args)
	s.stmts.leave = queries.Text("slots.leave", args)
	s.stmts.leaveJoined = queries.Text("slots.leave_joined", args)
	args["queue"], args["dequeue"] = queries.Text("slots.turn", args), queries.Text("slots.dequeue", args)
	args["turn"], args["turn_first"] = " AND (SELECT ok FROM turn)", "(SELECT ok FROM turn) AND "
	args["waiting"] = ", (SELECT ok FROM turn), EXISTS (SELECT FROM renewed)"
	s.stmts.wait = queries.Text("slots.acquire", args)
	s.stmts.enqueueFlow = queries.Text("slots.enqueue_flow", args)
	s.stmts.setWeight = queries.Text("slots.set_flow_weight", args)
	s.stmts.resetWeight = queries.Text("slots.reset_flow_weight", args)
	args["queue"] = queries.Text("slots.fair_turn", args)
	args["set_extra"], args["extra_col"], args["extra_val"] = ", flow = $9", ", flow", ", $9"
	s.stmts.waitFlow = queries.Text("slots.acquire", args)
	args["queue"], args["dequeue"] = queries.Text("slots.fair_join", args), queries.Text("slots.join_flow", args)
	args["waiting"] = ", (SELECT ok FROM turn), EXISTS (SELECT FROM joined), (SELECT arrived FROM joined)"
	args["set_extra"], args["extra_val"] = ", flow = $6", ", $6"
	s.stmts.joinFlow = queries.Text("slots.acquire", args)
	args["queue"], args["dequeue"], args["waiting"] = queries.Text("slots.no_waiters", args), "", ", (SELECT ok FROM turn), false"
	s.stmts.takeFlow = queries.Text("slots.acquire", args)
	args["queue"], args["set_extra"], args["extra_col"] = queries.Text("slots.level", args), ", level = $6", ", level"
	s.stmts.acquireLevel = queries.Text("slots.acquire", args)
	args["queue"] = queries.Text("slots.level_first", args)
	s.stmts.takeLevel = queries.Text("slots.acquire", args)
	args["queue"], args["dequeue"] = queries.Text("slots.level_turn", args), queries.Text("slots.dequeue", args)
	args["waiting"] = ", (SELECT ok FROM turn), EXISTS (SELECT FROM renewed)"
	args["set_extra"], args["extra_val"] = ", level = $9", ", $9"
	s.stmts.waitLevel = queries.Text("slots.acquire", args)
	s.stmts.enqueueLevel = queries.Text("slots.enqueue_level", args)
	return s, nil
}

// derivedNamespace is the namespace of a semaphore that names none: a
// fingerprint of what its rows mean, how many slots a key has, framed as
// pglimit's derived namespaces are. Part of the deployed protocol:
// instances of different releases must derive the same one
// (TestNamespaceDerived).
func derivedNamespace(slots int) string {
	h := sha256.New()
	for _, s := range []string{"pglimitsem.slots.v1", strconv.Itoa(slots)} {
		fmt.Fprintf(h, "%d:%s;", len(s), s)
	}
	return "default-" + hex.EncodeToString(h.Sum(nil)[:6])
}

const (
	slotsTable      = "pglimit_slots"
	waitersTable    = "pglimit_slot_waiters"
	flowsTable      = "pglimit_slot_flows"
	defaultWaitPoll = 50 * time.Millisecond
	maxSlots        = 10_000
	// defaultFlowQueue and maxFlowQueue bound Config.FlowQueue; maxWeight
	// a Flow's Weight.
	defaultFlowQueue = 1_000
	maxFlowQueue     = 100_000
	maxWeight        = 10_000
	defaultSlotTTL   = time.Minute

	// As a limiter's: the defaults of Config, the longest TTL (366 days),
	// and the attempts after a lost race.
	defaultSchema  = "public"
	defaultTimeout = 2 * time.Second
	maxTTL         = 366 * 24 * time.Hour
	maxAttempts    = 3

	// txClientTimeoutMargin is how much longer than Timeout AcquireTx and
	// ReleaseTx wait for the server, whose lock_timeout ends the wait and
	// keeps the caller's connection, before giving up on the connection.
	txClientTimeoutMargin = time.Second
)

// Acquire takes a slot of key if fewer than Slots are held, for TTL. A
// refusal writes nothing; its Slot says how many are held and when one may
// be free.
func (s *Semaphore) Acquire(ctx context.Context, key string) (Slot, error) {
	return s.observed(ctx, key, func() (Slot, error) {
		return s.acquire(ctx, key, s.cfg.Timeout, func(ctx context.Context, scan func(pgx.Row) error) error {
			return scan(s.db.QueryRow(ctx, s.stmts.acquire, s.args(key)...))
		})
	})
}

// AcquireTx is Acquire inside the caller's transaction tx; the slot is
// taken only if tx commits.
//
// tx is a pgx.Tx, or a database/sql one through pglimitsql.Tx. Other
// acquirers skip the slot while tx is open. Like AllowTx, AcquireTx runs
// in a savepoint and never aborts tx: a lost race is a refusal.
//
// Release the slot after the work: in tx with [Semaphore.ReleaseTx], and
// then the slot is held while tx is open and free once it commits; or
// after tx has committed, with Release. Release runs on the semaphore's
// own connections, which cannot see the slot before tx commits: there it
// reports [ErrSlotLost] and frees nothing.
func (s *Semaphore) AcquireTx(ctx context.Context, tx pglimit.DB, key string) (Slot, error) {
	return s.observed(ctx, key, func() (Slot, error) {
		return s.acquire(ctx, key, s.cfg.Timeout+txClientTimeoutMargin, func(ctx context.Context, scan func(pgx.Row) error) error {
			return pgtx.InSavepoint(ctx, tx, s.cfg.Timeout, s.stmts.acquire, s.args(key), scan)
		})
	})
}

// observed runs an acquisition and shows it to Config.Observe.
func (s *Semaphore) observed(ctx context.Context, key string, acquire func() (Slot, error)) (Slot, error) {
	start := time.Now()
	slot, err := acquire()
	if s.cfg.Observe != nil {
		s.cfg.Observe(ctx, Call{Namespace: s.cfg.Namespace, Key: key, Slot: slot, Err: err, Took: time.Since(start)})
	}
	return slot, err
}

func (s *Semaphore) args(key string) []any {
	return []any{s.cfg.Namespace, key, s.cfg.Slots, s.ttl, s.lockSeed}
}

// acquire runs the acquisition run under a deadline of bound.
func (s *Semaphore) acquire(ctx context.Context, key string, bound time.Duration, run func(context.Context, func(pgx.Row) error) error) (Slot, error) {
	slot, _, err := s.acquireInTurn(ctx, key, bound, run, nil)
	return slot, err
}

// acquireInTurn is acquire, for the waiter in the queue that q (not nil)
// is; queued reports whether the waiter still has its place (false once
// it took a slot, or its place lapsed), or for a first try whether it
// joined. more are the destinations of the statement's further columns.
func (s *Semaphore) acquireInTurn(ctx context.Context, key string, bound time.Duration, run func(context.Context, func(pgx.Row) error) error, q *place, more ...any) (_ Slot, queued bool, _ error) {
	if err := pglimit.ValidateKey(key); err != nil {
		return Slot{}, false, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, bound, pglimit.ErrTimeout)
	defer cancel()
	start := time.Now()
	// An attempt that finds no slot but fewer than Slots held either met
	// acquisitions in flight, which will hold the rest, or tried a slot
	// number that an acquisition committed after its snapshot; the next
	// attempt sees that one. Past the attempts, the slots it could not
	// see are counted held.
	out := Slot{Held: s.cfg.Slots, RetryAfter: s.hint(s.cfg.TTL)}
	for range min(s.cfg.Slots, 16) + maxAttempts {
		var (
			slot          *int32
			holder        *string
			end, firstEnd *int64
			held          int64
			now           int64
		)
		turn := true
		dest := []any{&slot, &holder, &end, &held, &firstEnd, &now}
		if q != nil {
			dest = append(append(dest, &turn, &queued), more...)
		}
		err := run(ctx, func(row pgx.Row) error { return row.Scan(dest...) })
		switch {
		case pgtx.Code(err) == pgtx.CodeSerializationFailure:
			// At REPEATABLE READ or above in a caller's transaction, a
			// slot changed after its snapshot: another acquirer won it.
			return out, queued, nil
		case err != nil:
			return Slot{}, false, s.wrap(ctx, err)
		case slot != nil:
			return Slot{Acquired: true, Held: int(held) + 1, ExpiresIn: time.Duration(*end-now) * time.Microsecond,
				key: key, slot: *slot, holder: *holder, acquired: start}, false, nil
		case !turn: // waiters ahead take the free slots
			out.Held, out.RetryAfter = int(held), s.cfg.WaitPoll
			return out, queued, nil
		}
		if int(held) >= s.cfg.Slots {
			return Slot{Held: int(held), RetryAfter: s.hint(time.Duration(*firstEnd-now) * time.Microsecond)}, queued, nil
		}
	}
	return out, queued, nil
}

// hint is a refusal's RetryAfter when the first held lease ends in
// leaseEnd.
func (s *Semaphore) hint(leaseEnd time.Duration) time.Duration {
	if h := time.Duration(s.hold.Load()); h > 0 {
		return min(h, leaseEnd)
	}
	return leaseEnd
}

// HoldTime is how long a slot of this semaphore is typically held.
//
// It is the average time from an acquisition to its release among those
// this process has seen, the recent ones weighing most (each release moves
// it a quarter of the way to its own hold). Before the first release it is
// TTL. Holds that ended with the lease, unreleased, are not counted.
func (s *Semaphore) HoldTime() time.Duration {
	if h := s.hold.Load(); h > 0 {
		return time.Duration(h)
	}
	return s.cfg.TTL
}

// held counts the hold of slot, which was just released.
func (s *Semaphore) held(slot Slot) {
	d := max(int64(time.Since(slot.acquired)), 1)
	for {
		old := s.hold.Load()
		avg := d
		if old > 0 {
			avg = max(old+(d-old)/4, 1)
		}
		if s.hold.CompareAndSwap(old, avg) {
			return
		}
	}
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

// Hold keeps slot's lease from ending while the caller works, until the
// returned release is called, which returns the slot.
//
// The lease is extended every third of its length, so that two
// extensions may fail before it ends; extending stops once the slot is
// lost ([ErrSlotLost]). release stops it, waits for an extension under
// way, and releases the slot. The statements run with ctx's values but
// not its cancellation: a slot goes back even after the caller gave up.
// failed, if not nil, receives every error of an extension or of the
// release.
func (s *Semaphore) Hold(ctx context.Context, slot Slot, failed func(error)) (release func()) {
	ctx = context.WithoutCancel(ctx)
	report := func(err error) {
		if err != nil && failed != nil {
			failed(err)
		}
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(max(slot.ExpiresIn/3, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				extended, err := s.Extend(ctx, slot)
				if err != nil {
					report(fmt.Errorf("extend the slot: %w", err))
					if errors.Is(err, ErrSlotLost) {
						return
					}
					continue
				}
				slot = extended
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		if err := s.Release(ctx, slot); err != nil {
			report(fmt.Errorf("release the slot: %w", err))
		}
	}
}

// Release frees a slot the caller holds. Releasing a slot twice, or after
// its lease ended, changes nothing and reports [ErrSlotLost]: the slot is
// never counted free twice, nor taken from a caller who acquired it since.
// So does releasing a slot AcquireTx took before its transaction commits:
// use ReleaseTx in that transaction, or Release after the commit.
func (s *Semaphore) Release(ctx context.Context, slot Slot) error {
	return s.release(ctx, slot, s.cfg.Timeout, func(ctx context.Context, scan func(pgx.Row) error) error {
		return scan(s.db.QueryRow(ctx, s.stmts.release, s.releaseArgs(slot)...))
	})
}

// ReleaseTx is Release inside the caller's transaction tx: the slot is
// freed only if tx commits. It releases a slot AcquireTx took in tx (the
// slot is then held while tx is open, and free once it commits), or one
// acquired before, in the transaction that records the work's end. Like
// AcquireTx, it runs in a savepoint and never aborts tx.
func (s *Semaphore) ReleaseTx(ctx context.Context, tx pglimit.DB, slot Slot) error {
	return s.release(ctx, slot, s.cfg.Timeout+txClientTimeoutMargin, func(ctx context.Context, scan func(pgx.Row) error) error {
		return pgtx.InSavepoint(ctx, tx, s.cfg.Timeout, s.stmts.release, s.releaseArgs(slot), scan)
	})
}

func (s *Semaphore) releaseArgs(slot Slot) []any {
	return []any{s.cfg.Namespace, slot.key, slot.slot, slot.holder}
}

// release runs the release run under a deadline of bound.
func (s *Semaphore) release(ctx context.Context, slot Slot, bound time.Duration, run func(context.Context, func(pgx.Row) error) error) error {
	if !slot.Acquired {
		return fmt.Errorf("%w: it was never acquired", ErrSlotLost)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, bound, pglimit.ErrTimeout)
	defer cancel()
	var notified bool // a row: the slot was released
	err := run(ctx, func(row pgx.Row) error { return row.Scan(&notified) })
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: its lease ended, or it was released already, or the transaction that acquired it has not committed", ErrSlotLost)
	case err != nil:
		return s.wrap(ctx, err)
	}
	s.held(slot)
	s.woken(slot.key)
	return nil
}

// Slots returns how many slots a key has: how many of its requests may be
// in flight at once.
func (s *Semaphore) Slots() int { return s.cfg.Slots }

// wrap is the engine's wrapping of a failure, named "semaphore": the
// sentinel of its cause (pglimit.ErrTimeout, ErrReadOnly, ErrUnavailable)
// in the engine's words.
func (s *Semaphore) wrap(ctx context.Context, err error) error {
	return fault.Wrap(ctx, "semaphore", s.cfg.Timeout, err)
}
