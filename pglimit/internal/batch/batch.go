package batch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
	"github.com/pglimit/cooldown/pglimit/internal/service"
)

// startLevel is where a Group's in-flight level starts; it moves from
// there by what the Group measures (level).
const startLevel = 2

// MaxKeys is the most keys one statement decides: a fuller batch is sent
// at once.
const MaxKeys = 256

// DB is what a Group runs its statements on.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config is a Group's: plain values.
type Config struct {
	DB      DB
	Timeout time.Duration // bounds each statement of the Group
	Expired error         // the cause of a statement's context past Timeout, which its callers' errors wrap

	// Namespace and LockClass are the statements' $1 and $4.
	Namespace string
	LockClass int32

	// SQL decides a batch, skipping rows that concurrent decisions lock;
	// WaitSQL decides one key, waiting for its row's lock. Both are
	// batch.allow, or batch.general when General is set.
	SQL, WaitSQL string
	General      bool
	Overrides    bool // batch.general answers the keys' own limits too (two more columns)

	// Pool, if set, is the pool's size and its connections in use now.
	// The in-flight level stays within the size less the connections
	// others use (those in use past the Group's own statements); without
	// Pool, within MaxKeys.
	Pool func() (size, busy int)

	// BackSQL gives a lease's tail back (batch.give_back); "" for none.
	BackSQL string

	// T and BurstT are a single GCRA limit's emission interval and span
	// (µs), when General is not set. It leases when [Leases] says so.
	T, BurstT int64

	// Contended is the SQLSTATE that means a concurrent decision holds
	// the key; "" for none.
	Contended string

	// Log receives the failures of give-backs. Defaults to slog.Default().
	Log *slog.Logger

	// Batched, if set, is told of each batch statement that ran: its
	// keys, how long it took, and its error.
	Batched func(ctx context.Context, keys []string, took time.Duration, err error)
	// Level, if set, is told of each change of the in-flight level: the
	// level it left and the level it is at.
	Level func(from, to int)
	// GaveBack, if set, is told of each give-back: its key, its units,
	// whether the row took them back, how long it took, and its error.
	GaveBack func(ctx context.Context, key string, units int64, returned bool, took time.Duration, err error)
}

// Kind is what a statement, or a lease, answered a call.
type Kind int

const (
	Admitted  Kind = iota // the database admitted the call's units
	Refused               // the database, or the lease standing for it, refused them
	Leased                // the lease handed them out
	Contended             // a concurrent decision held the key: a lost race
)

// Answer is a call's answer from a single GCRA limit's statement, or from
// its lease, in numbers (µs): for a D to be built from.
type Answer struct {
	Kind Kind
	// TAT is the key's theoretical arrival time: for an admission, just
	// after the call's units; for a refusal, as it stood; for units
	// leased, as the key's last statement left it.
	TAT int64
	// Now is the database time of the answer: the statement's clock, or
	// an upper estimate of it for a lease.
	Now  int64
	Left int64 // Leased: the units the lease holds after the call's
	// Wait, for a refusal by the lease, is how long until the lease's
	// units are usable; Full reports whether the row itself, by what its
	// last statement read, has no room either. Without Full, the call
	// waits Wait alone; with it, no longer than both.
	Wait time.Duration
	Full bool
}

// Row is a key's row as batch.general found it, and what it granted.
type Row struct {
	Granted, Now  int64
	State         []int64 // nil when the row had no state
	TAT           *int64
	Rates, Bursts []int64 // the key's own limits, with Config.Overrides
}

// Decider is what a Group asks of its limiter.
type Decider[D any] interface {
	// Run decides n units of key with the call's own statement.
	Run(ctx context.Context, key string, n int) (D, error)
	// Answer is the D of a single GCRA limit's answer a to n units of key.
	Answer(key string, n int, a Answer) D
	// General is the Ds of calls calls of n units each on key, of which
	// batch.general found row and admitted the first row.Granted.
	General(key string, n, calls int, row Row) ([]D, error)
	// Follow is the refusal of n units that last, the answer of a
	// statement of the key sent since ago, implies, if it implies one.
	Follow(last D, n int, since time.Duration) (D, bool)
	// Failed is err, a batch.general statement's error, as the limiter
	// reports it.
	Failed(err error) error
}

// Group is group commit for one limiter: see the package's doc. All
// methods are safe on a nil *Group, which does not batch.
type Group[D any] struct {
	cfg     Config
	decider Decider[D]
	size    int         // keys that fill a batch: MaxKeys (tests set it)
	leases  *leases     // nil when the limit does not lease
	sweeper *time.Timer // drops idle lease state (leases.sweep); nil while none is kept
	jobs    service.Jobs

	mu       sync.Mutex
	open     []*entry[D]          // gathering, in arrival order; sent together
	keys     map[string]*entry[D] // every entry open or on its way, by key
	inFlight int                  // statements running: direct calls and batches
	level    *level               // how many may run before calls gather

	took      time.Duration // the Group's statements' mean round trip (a moving average)
	openSince time.Time     // when the open batch began to gather
	stall     *time.Timer   // sends the open batch past the level once it waited too long
	stalling  bool          // stall is armed

	failures  atomic.Int64 // batch statements that failed (their calls were then decided one by one)
	givenBack atomic.Int64 // units of leases given back
}

// entry is one key's request in a batch: its calls' units, in one row of
// the statement. Its fields after sent are written before its calls are
// answered, and read after.
type entry[D any] struct {
	key     string
	n       int
	calls   []*call[D] // in arrival order, each of n units
	waiters []*call[D] // calls on the key that follow this entry's answer
	last    D          // the answer of the last call: the key as it stands after the entry

	want, ahead int64 // units asked for a lease beside the calls, and how far ahead (µs)
	found             // what its statement found; found.sent is zero while it gathers

	skipped bool // its batch's statement skipped it: decideSkipped decides it
}

// call is one Allow waiting for its entry. Its results are written before
// done is closed, and read after.
type call[D any] struct {
	key  string
	n    int
	at   time.Time // when it came
	done chan struct{}

	gone bool // the caller returned before its entry was sent; guarded by mu

	d     D
	err   error
	alone bool // the batch could not decide it: the caller runs its own statement
}

// New returns the Group of cfg, whose calls d decides.
func New[D any](cfg Config, d Decider[D]) *Group[D] {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	g := &Group[D]{cfg: cfg, decider: d, size: MaxKeys, keys: make(map[string]*entry[D])}
	g.jobs = service.Jobs{Timeout: cfg.Timeout, Cause: cfg.Expired}
	g.level = newLevel(startLevel, MaxKeys, cfg.Pool)
	if !cfg.General {
		g.leases = newLeases(cfg.T, cfg.BurstT)
	}
	if cfg.Level != nil {
		cfg.Level(0, g.level.now) // where it starts, for a gauge to show from the first call
	}
	return g
}

// Do decides n units of key, with other calls where they gather.
func (g *Group[D]) Do(ctx context.Context, key string, n int) (D, error) {
	c := &call[D]{key: key, n: n, at: time.Now(), done: make(chan struct{})}
	switch e, leased := g.submit(c); {
	case leased:
		return c.d, nil
	case e != nil && e.want == 0:
		// Alone and free to go: the caller's own statement, on its own
		// goroutine, as without the Group.
		c.d, c.err = g.decider.Run(ctx, key, n)
		e.last = c.d
		g.finishDirect(e)
		return c.d, c.err
	case e != nil:
		// Alone, asking for a lease too: the lease serves other calls, so
		// its statement runs on the limiter's clock, on a goroutine of its
		// own, and the caller waits for it no longer than ctx lets it.
		go func() {
			g.decide([]*entry[D]{e})
			g.finishDirect(e)
		}()
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		// A call not yet sent leaves and changes nothing; one already sent
		// is decided anyway, as a single statement cancelled in flight may
		// be.
		g.mu.Lock()
		c.gone = true
		g.mu.Unlock()
		var zero D
		return zero, ctx.Err()
	}
	if c.alone {
		return g.decider.Run(ctx, key, n)
	}
	return c.d, c.err
}

// finishDirect ends a statement that ran on its caller's goroutine, and
// sends what gathered meanwhile on a goroutine of its own.
func (g *Group[D]) finishDirect(e *entry[D]) {
	if next := g.finish([]*entry[D]{e}); next != nil {
		go g.send(next)
	}
}

// submit hands c its units from the key's lease (leased, with c.d set), or
// adds it to the entry of its key, or to a new one. It returns that new
// entry when c goes alone, now, on its caller's goroutine: fewer
// statements than the level run and nothing gathers. The caller then calls
// finish when its statement returns.
func (g *Group[D]) submit(c *call[D]) (direct *entry[D], leased bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var now time.Time
	if g.leases != nil {
		now = time.Now() // read under mu: a lease's unit is handed out no later than now
		if d, ok := g.fromLease(c.key, c.n, now); ok {
			c.d = d
			return nil, true
		}
	}
	if g.keys[c.key] == nil && len(g.open) == 0 && g.inFlight < g.level.now {
		e := g.newEntry(c.key, c.n, now)
		e.calls, e.sent = []*call[D]{c}, now
		if e.sent.IsZero() {
			e.sent = time.Now()
		}
		g.keys[c.key] = e
		g.inFlight++
		return e, false
	}
	if g.inFlight >= g.level.now {
		g.level.gathered()
	}
	g.enqueue(c)
	if len(g.open) >= g.size {
		go g.send(g.take())
	}
	return nil, false
}

// newEntry is a new entry of key for calls of n units, asking for the
// lease the key's demand calls for. It is called with mu held.
func (g *Group[D]) newEntry(key string, n int, now time.Time) *entry[D] {
	e := &entry[D]{key: key, n: n}
	if g.leases != nil {
		e.want, e.ahead = g.leases.want(key, now)
	}
	return e
}

// fromLease is the admission of n units of key from its lease, at now, if
// the lease holds them; it asks for the next lease when this one runs low.
// It is called with mu held.
func (g *Group[D]) fromLease(key string, n int, now time.Time) (D, bool) {
	at, left, wait, ok := g.leases.take(key, n, now)
	if !ok {
		return g.leaseRefusal(key, n, now, wait)
	}
	d := g.decider.Answer(key, n, Answer{Kind: Leased, TAT: g.leases.keys[key].end, Now: at, Left: left})
	if g.leases.low(key, left) && g.keys[key] == nil {
		// Refill in the background: an entry of no calls, asking for units.
		e := g.newEntry(key, 1, now)
		g.keys[key] = e
		g.gather(e)
		if len(g.open) == 1 && g.inFlight < g.level.now {
			go g.send(g.take())
		}
	}
	return d, true
}

// leaseRefusal is the refusal of n units of key at now without a round
// trip, when the database would refuse them too: the key's row had no room
// for them by what its last statement read (the row's TAT only grows, but
// for a Reset, which drops the lease), or the lease's units are not usable
// yet, which means the same (see the package's doc). wait is how long
// until the lease's units are, if it holds them. It is called with mu
// held.
func (g *Group[D]) leaseRefusal(key string, n int, now time.Time, wait time.Duration) (D, bool) {
	end, at, full := g.leases.full(key, n, now)
	if !full && wait == 0 {
		var zero D
		return zero, false
	}
	g.leases.met(key, now) // demand, which the next lease is sized by
	return g.decider.Answer(key, n, Answer{Kind: Refused, TAT: end, Now: at, Wait: wait, Full: full}), true
}

// enqueue adds c to the entry of its key: as one more call while the entry
// gathers and has c's cost, else as a waiter for its answer. A key with no
// entry gets a new one in the open batch. It is called with mu held.
func (g *Group[D]) enqueue(c *call[D]) {
	e := g.keys[c.key]
	if e == nil {
		e = g.newEntry(c.key, c.n, time.Now())
		e.calls = []*call[D]{c}
		g.keys[c.key] = e
		g.gather(e)
		return
	}
	if g.leases != nil {
		g.leases.met(c.key, time.Now())
		g.sweepLater()
	}
	if e.sent.IsZero() && e.n == c.n {
		e.calls = append(e.calls, c)
	} else {
		e.waiters = append(e.waiters, c)
	}
}

// gather adds e to the open batch. A batch that begins arms the stall
// timer, unless it is armed. It is called with mu held.
func (g *Group[D]) gather(e *entry[D]) {
	if len(g.open) == 0 {
		g.openSince = time.Now()
		g.stallLater(g.stallAfter())
	}
	g.open = append(g.open, e)
}

// stallAfter is how long the open batch waits for a running statement to
// return before it goes past the level: four of the Group's mean round
// trips, or a tenth of Config.Timeout before any returned. A statement
// slower than that, on a row a long transaction holds, say, holds back no
// other key. It is called with mu held.
func (g *Group[D]) stallAfter() time.Duration {
	if g.took == 0 {
		return g.cfg.Timeout / 10
	}
	return 4 * g.took
}

// stallLater arms the stall timer for after, unless it is armed. It is
// called with mu held.
func (g *Group[D]) stallLater(after time.Duration) {
	switch {
	case g.stalling:
	case g.stall == nil:
		g.stalling, g.stall = true, time.AfterFunc(after, g.stalled)
	default:
		g.stalling = true
		g.stall.Reset(after)
	}
}

// stalled is the stall timer's: it sends the open batch, past the level,
// once it has waited stallAfter, and comes back for a batch that began
// later.
func (g *Group[D]) stalled() {
	g.mu.Lock()
	g.stalling = false
	if len(g.open) == 0 {
		g.mu.Unlock()
		return
	}
	if wait := g.stallAfter() - time.Since(g.openSince); wait > 0 {
		g.stallLater(wait)
		g.mu.Unlock()
		return
	}
	bt := g.take()
	g.mu.Unlock()
	g.send(bt)
}

// take removes the open batch for sending, leaving out calls whose callers
// have returned, and counts its statement in flight. It is called with mu
// held.
func (g *Group[D]) take() []*entry[D] {
	bt := g.open
	now := time.Now()
	for _, e := range bt {
		live := e.calls[:0]
		for _, c := range e.calls {
			if !c.gone {
				live = append(live, c)
			}
		}
		e.calls, e.sent = live, now
	}
	g.open = nil
	g.inFlight++
	return bt
}

// send decides bt, then the batches that gathered meanwhile while it may.
func (g *Group[D]) send(bt []*entry[D]) {
	for bt != nil {
		g.decide(bt)
		bt = g.finish(bt)
	}
}

// finish ends the statement that decided bt's entries and settles them.
// It returns the open batch when it may go now, for the caller to send.
func (g *Group[D]) finish(bt []*entry[D]) (next []*entry[D]) {
	now := time.Now()
	var calls int
	var waited time.Duration
	for _, e := range bt {
		if e.skipped {
			continue // decideSkipped answers its calls
		}
		for _, c := range e.calls {
			calls++
			waited += now.Sub(c.at)
		}
	}
	g.mu.Lock()
	g.inFlight--
	if took := now.Sub(bt[0].sent); g.took == 0 {
		g.took = took
	} else {
		g.took += (took - g.took) / 8
	}
	g.level.finished(now, calls, waited, g.inFlight)
	from, to := g.level.change()
	answered := g.settle(slices.DeleteFunc(slices.Clone(bt), func(e *entry[D]) bool { return e.skipped }), now)
	next = g.next()
	g.mu.Unlock()
	release(answered)
	if to != 0 && g.cfg.Level != nil {
		g.cfg.Level(from, to)
	}
	return next
}

// next takes the open batch if it may go now: something gathers, and
// fewer statements than the level run. It is called with mu held.
func (g *Group[D]) next() []*entry[D] {
	if len(g.open) > 0 && g.inFlight < g.level.now {
		return g.take()
	}
	return nil
}

// release answers calls that settle decided.
func release[D any](answered []*call[D]) {
	for _, w := range answered {
		close(w.done)
	}
}

// settle ends bt's entries, decided, and their waiters: refused at once
// where an entry's answer leaves no room for them, else queued in the open
// batch, together, as of now, when their statement returned. It returns
// the waiters it answered, for the caller to release once mu is unlocked.
// It is called with mu held.
func (g *Group[D]) settle(bt []*entry[D], now time.Time) (answered []*call[D]) {
	for _, e := range bt {
		if g.keys[e.key] != e {
			continue // forgotten by a Reset: its lease is dropped
		}
		delete(g.keys, e.key)
		if g.leases != nil && e.t0 != 0 {
			g.leases.roundTrip(now.Sub(e.sent))
		}
		if e.want > 0 {
			if le := g.leases.add(e.key, e.found, now); le != nil && le.timer == nil {
				g.giveBackLater(e.key, le)
			}
		}
	}
	for _, e := range bt {
		for _, w := range e.waiters {
			if w.gone {
				continue
			}
			var ok bool
			if g.leases != nil {
				w.d, ok = g.fromLease(w.key, w.n, now)
			}
			if !ok && !g.cfg.General { // batch.general's answers are not GCRA's: nothing to share
				w.d, ok = g.decider.Follow(e.last, w.n, now.Sub(e.sent))
			}
			if ok {
				answered = append(answered, w)
			} else {
				g.enqueue(w)
			}
		}
	}
	return answered
}

// sweepLater arms the sweeper, unless it is armed: lease state, once
// kept, is dropped when idle, however few calls come after. It is called
// with mu held.
func (g *Group[D]) sweepLater() {
	if g.sweeper == nil {
		g.sweeper = time.AfterFunc(leaseIdle, g.sweep)
	}
}

// sweep is the sweeper's: it drops idle lease state, and comes back while
// some is kept.
func (g *Group[D]) sweep() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.leases.sweep(time.Now(), func(key string) bool { return g.keys[key] != nil }) {
		g.sweeper.Reset(leaseIdle)
	} else {
		g.sweeper = nil
	}
}

// giveBackLater arms le's timer, key's lease: giveBack, once it may be
// idle. It is called with mu held.
func (g *Group[D]) giveBackLater(key string, le *lease) {
	le.timer = time.AfterFunc(g.leases.quiet(), func() { g.giveBack(key, le) })
}

// giveBack is the timer of le, key's lease. Once no call has come to the
// lease for quiet, it gives the units of its last run back to the key's
// row, if the row is as that run's statement left it (batch.give_back): the
// row's TAT moves back over them, and another instance may admit them.
// The units are out of the lease while the statement runs, so that each
// slot is still handed out at most once. They come back to it if the row
// had moved on, and are lost, as units that expire are, if the statement
// fails: a failure is counted and logged.
func (g *Group[D]) giveBack(key string, le *lease) {
	g.mu.Lock()
	again, tail := g.leases.idle(key, le, time.Now(), g.keys[key] != nil)
	if again > 0 {
		le.timer.Reset(again)
	} else {
		le.timer = nil
	}
	g.mu.Unlock()
	if tail.left == 0 {
		return
	}
	var ok bool
	err := g.jobs.Do(func(ctx context.Context) error {
		began := nowIf(g.cfg.GaveBack != nil)
		tag, err := g.cfg.DB.Exec(ctx, g.cfg.BackSQL, g.cfg.Namespace, key, tail.left*g.cfg.T, tail.end, tail.xid)
		ok = err == nil && tag.RowsAffected() == 1
		if g.cfg.GaveBack != nil {
			g.cfg.GaveBack(ctx, key, tail.left, ok, time.Since(began), err)
		}
		return err
	})
	if err != nil {
		g.cfg.Log.Warn("pglimit: a lease's unused units could not be given back; they expire unused",
			"namespace", g.cfg.Namespace, "units", tail.left, "err", err)
	}
	g.mu.Lock()
	g.leases.given(key, le, tail, ok, err == nil && !ok)
	g.mu.Unlock()
	if ok {
		g.givenBack.Add(tail.left)
	}
}

// Forget drops key's lease and makes the next call on key start a new
// entry: a Reset may have changed what the entry on its way read, and
// whatever it leases is dropped. Calls already waiting for it were
// concurrent with the Reset and may still follow its answer. An entry
// still gathering is sent after the Reset, and stays, but asks for no
// lease: none that a call did not ask for is taken after the Reset.
func (g *Group[D]) Forget(key string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	switch e := g.keys[key]; {
	case e == nil:
	case !e.sent.IsZero():
		delete(g.keys, key)
	case len(e.calls) == 0 && len(e.waiters) == 0:
		delete(g.keys, key)
		g.open = slices.DeleteFunc(g.open, func(o *entry[D]) bool { return o == e })
	default:
		e.want = 0
	}
	if g.leases != nil {
		g.leases.forget(key)
	}
	g.mu.Unlock()
}

// Clear drops every lease, and what every entry on its way leases: the
// Invalidator may have missed a Reset.
func (g *Group[D]) Clear() {
	g.mu.Lock()
	for key, e := range g.keys {
		if !e.sent.IsZero() {
			delete(g.keys, key)
		}
	}
	if g.leases != nil {
		g.leases.clear()
	}
	g.mu.Unlock()
}

// decide runs bt's statement and answers its calls. Its context is the
// limiter's timeout alone: no caller's context may end it for the others.
// An entry the statement skipped is decided on a goroutine of its own
// (decideSkipped), which answers and settles it; finish leaves it alone.
func (g *Group[D]) decide(bt []*entry[D]) {
	ctx, cancel := context.WithTimeoutCause(context.Background(), g.cfg.Timeout, g.cfg.Expired)
	defer cancel()
	if len(bt) == 1 && len(bt[0].calls) == 1 && bt[0].want == 0 {
		e, c := bt[0], bt[0].calls[0]
		c.d, c.err = g.decider.Run(ctx, c.key, c.n)
		c.err = g.timedOut(ctx, c.err)
		e.last = c.d
	} else {
		g.decideMany(ctx, bt)
	}
	for _, e := range bt {
		if !e.skipped {
			answer(e)
		}
	}
}

// answer releases e's calls.
func answer[D any](e *entry[D]) {
	for _, c := range e.calls {
		close(c.done)
	}
}

// timedOut adds Config.Expired to err when it came from ctx, a
// statement's context bounded by the limiter's timeout, having run out.
func (g *Group[D]) timedOut(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), g.cfg.Expired) && !errors.Is(err, g.cfg.Expired) {
		return fmt.Errorf("%w: %w", g.cfg.Expired, err)
	}
	return err
}

// decideMany decides bt's entries, on distinct keys, in one statement that
// skips rows locked by concurrent decisions. Each entry it skipped is then
// decided by the statement for its key alone, which waits for the lock (on
// a busy key of two instances, one instance's statement is usually holding
// it), on a goroutine of its own: one slow key holds back no other. When
// the statement fails, its entries are decided by their callers' own
// statements if it surely changed nothing; if it may have committed, its
// callers get its error, as a single statement's caller does, and nothing
// is charged twice.
func (g *Group[D]) decideMany(ctx context.Context, bt []*entry[D]) {
	began := nowIf(g.cfg.Batched != nil)
	skipped, err := g.query(ctx, g.cfg.SQL, bt)
	g.observe(ctx, bt, began, err)
	if err != nil {
		g.failures.Add(1)
		for _, e := range bt {
			g.failed(ctx, e, err)
		}
		return
	}
	for _, e := range skipped {
		e.skipped = true
		go g.decideSkipped(e)
	}
}

// observe tells Config.Batched, if set, of the batch statement for bt's
// entries that began at began and failed with err, or not.
func (g *Group[D]) observe(ctx context.Context, bt []*entry[D], began time.Time, err error) {
	if g.cfg.Batched == nil {
		return
	}
	keys := make([]string, 0, len(bt))
	for _, e := range bt {
		if len(e.calls) > 0 || e.want > 0 { // the statement's keys (query)
			keys = append(keys, e.key)
		}
	}
	if len(keys) == 0 {
		return // every caller left before it was sent: no statement ran
	}
	g.cfg.Batched(ctx, keys, time.Since(began), err)
}

// nowIf returns the time if on, for an event that is observed; the zero
// time, without reading the clock, if not.
func nowIf(on bool) time.Time {
	if !on {
		return time.Time{}
	}
	return time.Now()
}

// decideSkipped decides e, which a batch statement skipped, with the
// statement for its key alone, on its own timeout; then answers e's calls
// and settles it. NoWait waits at most its patience, as its own statement
// does, and refuses after it.
func (g *Group[D]) decideSkipped(e *entry[D]) {
	ctx, cancel := context.WithTimeoutCause(context.Background(), g.cfg.Timeout, g.cfg.Expired)
	left, err := g.query(ctx, g.cfg.WaitSQL, []*entry[D]{e})
	switch {
	case pgtx.Code(err) != "" && pgtx.Code(err) == g.cfg.Contended:
		for _, c := range e.calls {
			c.d = g.decider.Answer(c.key, c.n, Answer{Kind: Contended})
		}
	case err != nil:
		g.failed(ctx, e, err)
	case len(left) > 0:
		alone(e)
	}
	cancel()
	now := time.Now()
	answer(e)
	g.mu.Lock()
	answered := g.settle([]*entry[D]{e}, now)
	next := g.next()
	g.mu.Unlock()
	release(answered)
	if next != nil {
		g.send(next)
	}
}

// failed settles e's calls after its statement failed with err: each
// caller runs its own statement when the failed one surely changed
// nothing, and gets err otherwise.
func (g *Group[D]) failed(ctx context.Context, e *entry[D], err error) {
	if !pgtx.UnknownOutcome(err) {
		alone(e)
		return
	}
	err = fmt.Errorf("batch statement, whose outcome is unknown: %w", g.timedOut(ctx, err))
	for _, c := range e.calls {
		c.err = err
	}
}

// alone makes e's calls decide with their own statements.
func alone[D any](e *entry[D]) {
	for _, c := range e.calls {
		c.alone = true
	}
}

// errLengths reports an answer whose arrays, one per column, differ in
// length.
var errLengths = errors.New("batch answer arrays differ in length")

// query runs sql, batch.allow in one of its variants, for bt's entries
// and answers the calls of those it decided. It returns those it did not:
// their rows were locked, or changed after the statement's snapshot.
func (g *Group[D]) query(ctx context.Context, sql string, bt []*entry[D]) (skipped []*entry[D], err error) {
	if g.cfg.General {
		return g.queryGeneral(ctx, sql, bt)
	}
	var reach int64 // how far past the burst a lease reaches
	if g.leases != nil {
		reach = g.leases.reach
	}
	var in struct {
		keys                        []string
		nT, tau, calls, want, ahead []int64
	}
	for _, e := range bt {
		if len(e.calls) == 0 && e.want == 0 {
			continue
		}
		in.keys = append(in.keys, e.key)
		nT, tau := arith.GCRACost(e.n, g.cfg.T, g.cfg.BurstT)
		if e.want > 0 {
			tau = g.cfg.BurstT - g.cfg.T + reach // anything fits when a unit of the lease does
		}
		in.nT = append(in.nT, nT)
		in.tau = append(in.tau, tau)
		in.calls = append(in.calls, int64(len(e.calls)))
		in.want = append(in.want, e.want)
		in.ahead = append(in.ahead, e.ahead)
	}
	if len(in.keys) == 0 {
		return nil, nil // every caller left before the batch was sent
	}
	var out struct {
		keys                                       []string
		granted, tat, now, leased, leaseStart, xid []int64
	}
	err = g.cfg.DB.QueryRow(ctx, sql, g.cfg.Namespace, in.keys, in.nT, g.cfg.LockClass, in.tau, in.calls,
		in.want, in.ahead, g.cfg.T, g.cfg.BurstT, reach).
		Scan(&out.keys, &out.granted, &out.tat, &out.now, &out.leased, &out.leaseStart, &out.xid, nil)
	if err == nil && !sameLengths(len(out.keys), len(out.granted), len(out.tat), len(out.now), len(out.leased), len(out.leaseStart), len(out.xid)) {
		err = errLengths
	}
	if err != nil {
		return nil, err
	}
	byKey := indexOf(out.keys)
	for _, e := range bt {
		i, ok := byKey[e.key]
		if !ok {
			skipped = append(skipped, e)
			continue
		}
		// The first granted calls were admitted one after the other, each
		// moving the TAT by its n*T; the rest found no room after them.
		granted, tat, now := int(out.granted[i]), out.tat[i], out.now[i]
		e.leased, e.start, e.t0, e.row, e.xid = out.leased[i], out.leaseStart[i], now, tat, out.xid[i]
		if e.leased > 0 {
			e.row = e.start + e.leased*g.cfg.T
		}
		if len(e.calls) == 0 {
			continue
		}
		nT := int64(e.n) * g.cfg.T
		for j, c := range e.calls {
			if j < granted {
				c.d = g.decider.Answer(e.key, e.n, Answer{Kind: Admitted, TAT: tat - int64(granted-1-j)*nT, Now: now})
			} else {
				c.d = g.decider.Answer(e.key, e.n, Answer{Kind: Refused, TAT: e.row, Now: now})
			}
		}
		e.last = e.calls[len(e.calls)-1].d
	}
	return skipped, nil
}

// queryGeneral is query for batch.general: it runs sql, in one of its
// variants, for bt's entries, and answers the calls of those it decided.
// It returns those it did not.
func (g *Group[D]) queryGeneral(ctx context.Context, sql string, bt []*entry[D]) (skipped []*entry[D], err error) {
	var in struct {
		keys     []string
		n, calls []int64
	}
	for _, e := range bt {
		if len(e.calls) == 0 {
			continue
		}
		in.keys = append(in.keys, e.key)
		in.n = append(in.n, int64(e.n))
		in.calls = append(in.calls, int64(len(e.calls)))
	}
	if len(in.keys) == 0 {
		return nil, nil // every caller left before the batch was sent
	}
	var out struct {
		keys          []string
		granted, now  []int64
		state         [][]int64
		stated        []bool
		tat           []*int64
		rates, bursts [][]int64 // the keys' own limits' (Config.Overrides)
	}
	dest := []any{&out.keys, &out.granted, &out.state, &out.stated, &out.tat, &out.now, nil}
	if g.cfg.Overrides {
		dest = append(dest, &out.rates, &out.bursts)
	}
	err = g.cfg.DB.QueryRow(ctx, sql, g.cfg.Namespace, in.keys, in.n, g.cfg.LockClass, in.calls).Scan(dest...)
	if err != nil {
		return nil, g.decider.Failed(err)
	}
	lengths := []int{len(out.keys), len(out.granted), len(out.state), len(out.stated), len(out.tat), len(out.now)}
	if g.cfg.Overrides {
		lengths = append(lengths, len(out.rates), len(out.bursts))
	}
	if !sameLengths(lengths...) {
		return nil, errLengths
	}
	byKey := indexOf(out.keys)
	for _, e := range bt {
		i, ok := byKey[e.key]
		switch {
		case !ok:
			skipped = append(skipped, e)
			continue
		case len(e.calls) == 0:
			continue
		}
		row := Row{Granted: out.granted[i], Now: out.now[i], TAT: out.tat[i]}
		if out.stated[i] {
			row.State = out.state[i]
		}
		if g.cfg.Overrides {
			row.Rates, row.Bursts = out.rates[i], out.bursts[i]
		}
		ds, err := g.decider.General(e.key, e.n, len(e.calls), row)
		for j, c := range e.calls {
			if err != nil {
				var zero D
				c.d, c.err = zero, err
			} else {
				c.d = ds[j]
			}
		}
		e.last = e.calls[len(e.calls)-1].d
	}
	return skipped, nil
}

// indexOf is each key's index in keys.
func indexOf(keys []string) map[string]int {
	byKey := make(map[string]int, len(keys))
	for i, k := range keys {
		byKey[k] = i
	}
	return byKey
}

// sameLengths reports whether every length is the first.
func sameLengths(lengths ...int) bool {
	for _, k := range lengths {
		if k != lengths[0] {
			return false
		}
	}
	return true
}

// Failures is how many of the Group's batch statements failed.
func (g *Group[D]) Failures() int64 { return g.failures.Load() }

// GivenBack is how many units of its leases the Group has given back.
func (g *Group[D]) GivenBack() int64 { return g.givenBack.Load() }

// GiveBackFailures is how many give-backs failed.
func (g *Group[D]) GiveBackFailures() int64 { return g.jobs.Failures() }

// Pending is how many calls wait in the open batch.
func (g *Group[D]) Pending() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, e := range g.open {
		n += len(e.calls)
	}
	return n
}

// Level is how many statements may run now before calls gather.
func (g *Group[D]) Level() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.level.now
}

// SetSize sets how many keys fill a batch, so that a test decides when a
// batch is sent.
func (g *Group[D]) SetSize(size int) {
	g.mu.Lock()
	g.size = size
	g.mu.Unlock()
}

// LeaseUnits is how many units of key's lease the Group holds now.
func (g *Group[D]) LeaseUnits(key string) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.leases == nil || g.leases.keys[key] == nil {
		return 0
	}
	return g.leases.keys[key].expire(time.Now(), g.leases.unit)
}

// Config is the Group's configuration; the zero Config for a nil Group.
func (g *Group[D]) Config() Config {
	if g == nil {
		return Config{}
	}
	return g.cfg
}

// Leases reports whether the Group leases.
func (g *Group[D]) Leases() bool { return g != nil && g.leases != nil }
