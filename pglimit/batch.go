package pglimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// batcher is group commit for Allow and AllowN: concurrent calls of one
// limiter in one process share statements, so that many decisions cost one
// round trip, one transaction and one WAL flush. It serves any limits on
// Upsert and NoWait: a single GCRA limit (a cooldown among them) with
// batch.allow, which also leases; any other set with batch.general
// (batch_general.go). All methods are safe on a nil *batcher: no batching.
//
// While fewer than inFlightLimit of the limiter's statements run, a call
// runs its own single-key statement at once, on its own goroutine: a lone
// caller pays a mutex and nothing else, and never waits for a window.
// Calls that arrive while the limit is reached gather in one open batch,
// which is sent as soon as one of the running statements returns (or at
// once when it holds maxBatchKeys keys).
//
// Calls on one key merge into one entry: the entry asks for up to the sum of
// its calls' units, and the units go to the calls in arrival order, each all
// or nothing, exactly as their own statements would have decided one after
// the other at that clock reading. Calls on a key whose entry is already on
// its way (or has another cost) wait for its answer: they are refused at
// once if that answer leaves them no room, and try again otherwise.
//
// The batcher has no goroutine of its own: a batch runs on a goroutine that
// ends with its statement, so there is nothing to close, and a batch whose
// callers have all returned still ends within Config.Timeout.
type batcher struct {
	l       *limiter
	general bool        // any set of limits but a single GCRA limit: batch.general decides
	sql     string      // batch.allow or batch.general, skipping rows locked by concurrent decisions
	waitSQL string      // the same for one key, waiting for its row's lock
	backSQL string      // batch.give_back; "" for batch.general, which leases nothing
	size    int         // keys that fill a batch: maxBatchKeys (tests set it)
	leases  *leases     // nil when the limit does not lease (lease.go)
	sweeper *time.Timer // drops idle lease state (leases.sweep); nil while none is kept

	mu       sync.Mutex
	open     []*entry          // gathering, in arrival order; sent together
	keys     map[string]*entry // every entry open or on its way, by key
	inFlight int               // statements running: direct calls and batches

	// failures counts batch statements that failed (their calls were then
	// decided one by one); tests read it, and givenBack, the units of
	// leases given back.
	failures, givenBack int64
}

// inFlightLimit is how many of a limiter's statements may run at once before
// calls gather: two, so that one batch gathers while the other runs, and
// the server works on one while the other waits for its WAL flush
// (docs/throughput.md has the measurements behind it).
const inFlightLimit = 2

// maxBatchKeys is the most keys one statement decides: a fuller batch is
// sent at once.
const maxBatchKeys = 256

// entry is one key's request in a batch: its calls' units, in one row of
// the statement. Its fields after sent are written before its calls are
// answered, and read after.
type entry struct {
	key     string
	n       int
	calls   []*call // in arrival order, each of n units
	waiters []*call // calls on the key that follow this entry's answer
	sent    time.Time
	last    Decision // the decision of the last call: the key as it stands after the entry

	want, ahead int64 // units asked for a lease beside the calls, and how far ahead (µs)
	leased      int64 // units the statement leased, from TAT start read at t0
	start, t0   int64
	row         int64 // the key's TAT as the statement left it
	xid         int64 // the transaction that wrote it, 0 if none did

	skipped bool // its batch's statement skipped it: decideSkipped decides it
}

// call is one Allow waiting for its entry. Its results are written before
// done is closed, and read after.
type call struct {
	key  string
	n    int
	q    query
	done chan struct{}

	gone bool // the caller returned before its entry was sent; guarded by mu

	d     Decision
	err   error
	alone bool // the batch could not decide it: the caller runs its own statement
}

// newBatcher returns l's batcher, or nil when l does not batch: l is not
// on Upsert or NoWait. table and column fill the batch statements as they
// fill the single-key statements: batch.allow for a single GCRA limit,
// batch.general for any other set of limits.
func newBatcher(l *limiter, table, column string) *batcher {
	if l.cfg.Strategy == Range {
		return nil
	}
	patience := "true" // Upsert waits for a lock as long as Config.Timeout lets it
	if l.cfg.Strategy == NoWait {
		patience = queries.Static("nowait.condition") // set before the first lock
	}
	b := &batcher{l: l, size: maxBatchKeys, keys: make(map[string]*entry)}
	if !l.single { // per-key limits among them
		b.general = true
		b.sql = generalBatch(l, table, column, "", "true")
		b.waitSQL = generalBatch(l, table, column, "true", patience)
		return b
	}
	b.sql = queries.Text("batch.allow", queries.Args{"table": table, "setting": column, "wait": "", "patience": "true"})
	b.waitSQL = queries.Text("batch.allow", queries.Args{"table": table, "setting": column, "wait": "true", "patience": patience})
	b.backSQL = queries.Text("batch.give_back", queries.Args{"table": table})
	b.leases = newLeases(l.emission, l.burstT)
	return b
}

// do decides q, a request of n units on key, in a batch.
func (b *batcher) do(ctx context.Context, key string, n int, q query) (Decision, error) {
	c := &call{key: key, n: n, q: q, done: make(chan struct{})}
	switch e, leased := b.submit(c); {
	case leased:
		return c.d, nil
	case e != nil && e.want == 0:
		// Alone and free to go: the caller's own statement, on its own
		// goroutine, as without the batcher.
		c.d, c.err = b.l.run(ctx, q)
		e.last = c.d
		b.finishDirect(e)
		return c.d, c.err
	case e != nil:
		// Alone, asking for a lease too: the lease serves other calls, so
		// its statement runs on the limiter's clock, on a goroutine of its
		// own, and the caller waits for it no longer than ctx lets it.
		go func() {
			b.decide([]*entry{e})
			b.finishDirect(e)
		}()
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		// A call not yet sent leaves and changes nothing; one already sent
		// is decided anyway, as a single statement cancelled in flight may
		// be.
		b.mu.Lock()
		c.gone = true
		b.mu.Unlock()
		return Decision{}, ctx.Err()
	}
	if c.alone {
		return b.l.run(ctx, q)
	}
	return c.d, c.err
}

// finishDirect ends a statement that ran on its caller's goroutine, and
// sends what gathered meanwhile on a goroutine of its own.
func (b *batcher) finishDirect(e *entry) {
	if next := b.finish([]*entry{e}); next != nil {
		go b.send(next)
	}
}

// submit hands c its units from the key's lease (leased, with c.d set), or
// adds it to the entry of its key, or to a new one. It returns that new
// entry when c goes alone, now, on its caller's goroutine: fewer than
// inFlightLimit statements run and nothing gathers. The caller then calls
// finish when its statement returns.
func (b *batcher) submit(c *call) (direct *entry, leased bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var now time.Time
	if b.leases != nil {
		now = time.Now()
		if d, ok := b.fromLease(c.key, c.n, now); ok {
			c.d = d
			return nil, true
		}
	}
	if b.keys[c.key] == nil && len(b.open) == 0 && b.inFlight < inFlightLimit {
		e := b.newEntry(c.key, c.n, now)
		e.calls, e.sent = []*call{c}, now
		if e.sent.IsZero() {
			e.sent = time.Now()
		}
		b.keys[c.key] = e
		b.inFlight++
		return e, false
	}
	b.enqueue(c)
	if len(b.open) >= b.size {
		go b.send(b.take())
	}
	return nil, false
}

// newEntry is a new entry of key for calls of n units, asking for the
// lease the key's demand calls for. It is called with mu held.
func (b *batcher) newEntry(key string, n int, now time.Time) *entry {
	e := &entry{key: key, n: n}
	if b.leases != nil {
		e.want, e.ahead = b.leases.want(key, now)
	}
	return e
}

// fromLease is the admission of n units of key from its lease, at now, if
// the lease holds them; it asks for the next lease when this one runs low.
// It is called with mu held.
func (b *batcher) fromLease(key string, n int, now time.Time) (Decision, bool) {
	at, left, wait, ok := b.leases.take(key, n, now)
	if !ok {
		return b.leaseRefusal(key, n, now, wait)
	}
	d := Decision{Allowed: true, Granted: n, Remaining: int(left), Limit: b.l.cfg.Limits[0], policy: b.l.policy, at: at, leased: true}
	d.ResetAfter = micros(max(b.leases.keys[key].end-at, 0))
	if b.leases.low(key, left) && b.keys[key] == nil {
		// Refill in the background: an entry of no calls, asking for units.
		e := b.newEntry(key, 1, now)
		b.keys[key] = e
		b.open = append(b.open, e)
		if len(b.open) == 1 && b.inFlight < inFlightLimit {
			go b.send(b.take())
		}
	}
	return d, true
}

// leaseRefusal is the refusal of n units of key at now without a round
// trip, when the database would refuse them too: the key's row had no room
// for them by what its last statement read (the row's TAT only grows, but
// for a Reset, which drops the lease), or the lease's units are not usable
// yet, which means the same (lease.go). wait is how long until the lease's
// units are, if it holds them. It is called with mu held.
func (b *batcher) leaseRefusal(key string, n int, now time.Time, wait time.Duration) (Decision, bool) {
	end, at, full := b.leases.full(key, n, now)
	if !full && wait == 0 {
		return Decision{}, false
	}
	b.leases.met(key, now) // demand, which the next lease is sized by
	d := b.l.gcraDecision(false, end, at, n)
	if wait > 0 && (!full || wait < d.RetryAfter) {
		d.RetryAfter = wait
		if n == 1 {
			d.next = wait
		}
	}
	return d, true
}

// enqueue adds c to the entry of its key: as one more call while the entry
// gathers and has c's cost, else as a waiter for its answer. A key with no
// entry gets a new one in the open batch. It is called with mu held.
func (b *batcher) enqueue(c *call) {
	e := b.keys[c.key]
	if e == nil {
		e = b.newEntry(c.key, c.n, time.Now())
		e.calls = []*call{c}
		b.keys[c.key] = e
		b.open = append(b.open, e)
		return
	}
	if b.leases != nil {
		b.leases.met(c.key, time.Now())
		b.sweepLater()
	}
	if e.sent.IsZero() && e.n == c.n {
		e.calls = append(e.calls, c)
	} else {
		e.waiters = append(e.waiters, c)
	}
}

// take removes the open batch for sending, leaving out calls whose callers
// have returned, and counts its statement in flight. It is called with mu
// held.
func (b *batcher) take() []*entry {
	bt := b.open
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
	b.open = nil
	b.inFlight++
	return bt
}

// send decides bt, then the batches that gathered meanwhile while it may.
func (b *batcher) send(bt []*entry) {
	for bt != nil {
		b.decide(bt)
		bt = b.finish(bt)
	}
}

// finish ends the statement that decided bt's entries and settles them.
// It returns the open batch when it may go now, for the caller to send.
func (b *batcher) finish(bt []*entry) (next []*entry) {
	b.mu.Lock()
	b.inFlight--
	answered := b.settle(slices.DeleteFunc(slices.Clone(bt), func(e *entry) bool { return e.skipped }))
	next = b.next()
	b.mu.Unlock()
	release(answered)
	return next
}

// next takes the open batch if it may go now: something gathers, and
// fewer than inFlightLimit statements run. It is called with mu held.
func (b *batcher) next() []*entry {
	if len(b.open) > 0 && b.inFlight < inFlightLimit {
		return b.take()
	}
	return nil
}

// release answers calls that settle decided.
func release(answered []*call) {
	for _, w := range answered {
		close(w.done)
	}
}

// settle ends bt's entries, decided, and their waiters: refused at once
// where an entry's answer leaves no room for them, else queued in the open
// batch, together. It returns the waiters it answered, for the caller to
// release once mu is unlocked. It is called with mu held.
func (b *batcher) settle(bt []*entry) (answered []*call) {
	now := time.Now()
	for _, e := range bt {
		if b.keys[e.key] != e {
			continue // forgotten by a Reset: its lease is dropped
		}
		delete(b.keys, e.key)
		if b.leases != nil && e.t0 != 0 {
			b.leases.roundTrip(now.Sub(e.sent))
		}
		if e.want > 0 {
			if le := b.leases.add(e, now); le != nil && le.timer == nil {
				b.giveBackLater(e.key, le)
			}
		}
	}
	for _, e := range bt {
		for _, w := range e.waiters {
			if w.gone {
				continue
			}
			var ok bool
			if b.leases != nil {
				w.d, ok = b.fromLease(w.key, w.n, now)
			}
			if !ok {
				w.d, ok = b.follow(e, w.n)
			}
			if ok {
				answered = append(answered, w)
			} else {
				b.enqueue(w)
			}
		}
	}
	return answered
}

// sweepLater arms the sweeper, unless it is armed: lease state, once
// kept, is dropped when idle, however few calls come after. It is called
// with mu held.
func (b *batcher) sweepLater() {
	if b.sweeper == nil {
		b.sweeper = time.AfterFunc(leaseIdle, b.sweep)
	}
}

// sweep is the sweeper's: it drops idle lease state, and comes back while
// some is kept.
func (b *batcher) sweep() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.leases.sweep(time.Now(), func(key string) bool { return b.keys[key] != nil }) {
		b.sweeper.Reset(leaseIdle)
	} else {
		b.sweeper = nil
	}
}

// giveBackLater arms le's timer, key's lease: giveBack, once it may be
// idle. It is called with mu held.
func (b *batcher) giveBackLater(key string, le *lease) {
	le.timer = time.AfterFunc(b.leases.quiet(), func() { b.giveBack(key, le) })
}

// giveBack is the timer of le, key's lease. Once no call has come to the
// lease for quiet, it gives the units of its last run back to the key's
// row, if the row is as that run's statement left it (batch.give_back): the
// row's TAT moves back over them, and another instance may admit them.
// The units are out of the lease while the statement runs, so that each
// slot is still handed out at most once. They come back to it if the row
// had moved on, and are lost, as units that expire are, if the statement
// fails.
func (b *batcher) giveBack(key string, le *lease) {
	b.mu.Lock()
	again, tail := b.leases.idle(key, le, time.Now(), b.keys[key] != nil)
	if again > 0 {
		le.timer.Reset(again)
	} else {
		le.timer = nil
	}
	b.mu.Unlock()
	if tail.left == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.l.cfg.Timeout)
	defer cancel()
	began := nowIf(b.l.observers.leases != nil)
	tag, err := b.l.db.Exec(ctx, b.backSQL, b.l.args.namespace, key, tail.left*b.l.emission, tail.end, tail.xid)
	ok := err == nil && tag.RowsAffected() == 1
	b.l.observeGiveBack(ctx, key, tail.left, ok, began, err)
	b.mu.Lock()
	b.leases.given(key, le, tail, ok, err == nil && !ok)
	if ok {
		b.givenBack += tail.left
	}
	b.mu.Unlock()
}

// Forget drops key's lease and makes the next call on key start a new
// entry: a Reset may have changed what the entry on its way read, and
// whatever it leases is dropped. Calls already waiting for it were
// concurrent with the Reset and may still follow its answer. An entry
// still gathering is sent after the Reset, and stays, but asks for no
// lease: none that a call did not ask for is taken after the Reset.
func (b *batcher) Forget(key string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	switch e := b.keys[key]; {
	case e == nil:
	case !e.sent.IsZero():
		delete(b.keys, key)
	case len(e.calls) == 0 && len(e.waiters) == 0:
		delete(b.keys, key)
		b.open = slices.DeleteFunc(b.open, func(o *entry) bool { return o == e })
	default:
		e.want = 0
	}
	if b.leases != nil {
		b.leases.forget(key)
	}
	b.mu.Unlock()
}

// Clear drops every lease, and what every entry on its way leases: the
// Invalidator may have missed a Reset.
func (b *batcher) Clear() {
	b.mu.Lock()
	for key, e := range b.keys {
		if !e.sent.IsZero() {
			delete(b.keys, key)
		}
	}
	if b.leases != nil {
		b.leases.clear()
	}
	b.mu.Unlock()
}

// follow is the refusal, for a call of n units that waited for e, that e's
// answer implies: ok when the key has no room for the call even now.
func (b *batcher) follow(e *entry, n int) (Decision, bool) {
	if e.last.at == 0 || b.general { // not decided by the database, or not GCRA's: nothing to share
		return Decision{}, false
	}
	return b.l.followGCRA(e.last, n, time.Since(e.sent))
}

// decide runs bt's statement and answers its calls. Its context is the
// limiter's timeout alone: no caller's context may end it for the others.
// An entry the statement skipped is decided on a goroutine of its own
// (decideSkipped), which answers and settles it; finish leaves it alone.
func (b *batcher) decide(bt []*entry) {
	ctx, cancel := context.WithTimeoutCause(context.Background(), b.l.cfg.Timeout, ErrTimeout)
	defer cancel()
	if len(bt) == 1 && len(bt[0].calls) == 1 && bt[0].want == 0 {
		e, c := bt[0], bt[0].calls[0]
		c.d, c.err = b.l.run(ctx, c.q)
		c.err = b.timedOut(ctx, c.err)
		e.last = c.d
	} else {
		b.decideMany(ctx, bt)
	}
	for _, e := range bt {
		if !e.skipped {
			answer(e)
		}
	}
}

// answer releases e's calls.
func answer(e *entry) {
	for _, c := range e.calls {
		close(c.done)
	}
}

// timedOut adds ErrTimeout to err when it came from ctx, a statement's
// context bounded by the limiter's timeout, having run out.
func (b *batcher) timedOut(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), ErrTimeout) && !errors.Is(err, ErrTimeout) {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
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
func (b *batcher) decideMany(ctx context.Context, bt []*entry) {
	began := nowIf(b.l.observers.batches != nil)
	skipped, err := b.query(ctx, b.sql, bt)
	b.l.observeBatch(ctx, bt, began, err)
	if err != nil {
		b.mu.Lock()
		b.failures++
		b.mu.Unlock()
		for _, e := range bt {
			b.failed(ctx, e, err)
		}
		return
	}
	for _, e := range skipped {
		e.skipped = true
		go b.decideSkipped(e)
	}
}

// decideSkipped decides e, which a batch statement skipped, with the
// statement for its key alone, on its own timeout; then answers e's calls
// and settles it. NoWait waits at most noWaitPatience, as its own
// statement does (strategy.go), and refuses after it.
func (b *batcher) decideSkipped(e *entry) {
	ctx, cancel := context.WithTimeoutCause(context.Background(), b.l.cfg.Timeout, ErrTimeout)
	left, err := b.query(ctx, b.waitSQL, []*entry{e})
	switch {
	case pgtx.Code(err) != "" && pgtx.Code(err) == b.l.contended:
		for _, c := range e.calls {
			c.d = b.l.lostRace()
		}
	case err != nil:
		b.failed(ctx, e, err)
	case len(left) > 0:
		b.alone(e)
	}
	cancel()
	answer(e)
	b.mu.Lock()
	answered := b.settle([]*entry{e})
	next := b.next()
	b.mu.Unlock()
	release(answered)
	if next != nil {
		b.send(next)
	}
}

// failed settles e's calls after its statement failed with err: each
// caller runs its own statement when the failed one surely changed
// nothing, and gets err otherwise.
func (b *batcher) failed(ctx context.Context, e *entry, err error) {
	if !unknownOutcome(err) {
		b.alone(e)
		return
	}
	err = fmt.Errorf("batch statement, whose outcome is unknown: %w", b.timedOut(ctx, err))
	for _, c := range e.calls {
		c.err = err
	}
}

// unknownOutcome reports whether a statement that failed with err may have
// committed: its error came neither before it was sent nor from the server
// aborting it. A connection lost after the statement was sent, a timeout
// that closed it, or a backend terminated while its commit waited for a
// synchronous standby (FATAL, after the commit) all may have.
func unknownOutcome(err error) bool {
	if pgconn.SafeToRetry(err) {
		return false
	}
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pe.Severity == "FATAL" || pe.Severity == "PANIC"
	}
	return true
}

// alone makes e's calls decide with their own statements.
func (b *batcher) alone(e *entry) {
	for _, c := range e.calls {
		c.alone = true
	}
}

// query runs sql, batch.allow in one of its variants, for bt's entries
// and answers the calls of those it decided. It returns those it did not:
// their rows were locked, or changed after the statement's snapshot.
func (b *batcher) query(ctx context.Context, sql string, bt []*entry) (skipped []*entry, err error) {
	if b.general {
		return b.queryGeneral(ctx, sql, bt)
	}
	var reach int64 // how far past the burst a lease reaches
	if b.leases != nil {
		reach = b.leases.reach
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
		nT := int64(e.n) * b.l.emission
		in.nT = append(in.nT, nT)
		tau := b.l.burstT - nT
		if e.want > 0 {
			tau = b.l.burstT - b.l.emission + reach // anything fits when a unit of the lease does
		}
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
	args := []any{b.l.args.namespace, in.keys, in.nT, b.l.args.lockClass, in.tau, in.calls,
		in.want, in.ahead, b.l.emission, b.l.burstT, reach}
	scan := func(row pgx.Row) error {
		return row.Scan(&out.keys, &out.granted, &out.tat, &out.now, &out.leased, &out.leaseStart, &out.xid, nil)
	}
	err = scan(b.l.db.QueryRow(ctx, sql, args...))
	if err == nil {
		for _, a := range [][]int64{out.granted, out.tat, out.now, out.leased, out.leaseStart, out.xid} {
			if len(a) != len(out.keys) {
				err = errors.New("batch answer arrays differ in length")
			}
		}
	}
	if err != nil {
		return nil, err
	}
	byKey := make(map[string]int, len(out.keys))
	for i, k := range out.keys {
		byKey[k] = i
	}
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
			e.row = e.start + e.leased*b.l.emission
		}
		if len(e.calls) == 0 {
			continue
		}
		nT := int64(e.n) * b.l.emission
		for j, c := range e.calls {
			if j < granted {
				at := tat - int64(granted-1-j)*nT
				c.d = b.l.withTicket(b.l.gcraDecision(true, at, now, e.n), e.key, b.l.cfg.Limits, []int64{at})
			} else {
				c.d = b.l.gcraDecision(false, e.row, now, e.n)
			}
		}
		e.last = e.calls[len(e.calls)-1].d
	}
	return skipped, nil
}
