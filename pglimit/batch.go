package pglimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// batcher is group commit for Allow and AllowN: concurrent calls of one
// limiter in one process share statements, so that many decisions cost one
// round trip, one transaction and one WAL flush. It serves a single GCRA
// limit (a cooldown among them) on Upsert and NoWait; everything else
// bypasses it. All methods are safe on a nil *batcher: no batching.
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
	l    *stmtLimiter
	sql  string
	size int // keys that fill a batch: maxBatchKeys (tests set it)

	mu       sync.Mutex
	open     []*entry          // gathering, in arrival order; sent together
	keys     map[string]*entry // every entry open or on its way, by key
	inFlight int               // statements running: direct calls and batches

	// failures counts batch statements that failed (their calls were then
	// decided one by one); tests read it.
	failures int64
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

// newBatcher returns l's batcher, or nil when l does not batch: l is not a
// single GCRA limit on Upsert or NoWait. table and column fill batchAllowSQL
// as they fill the single-key statements.
func newBatcher(l *stmtLimiter, table, column string) *batcher {
	if !l.single || l.cfg.Strategy == Range {
		return nil
	}
	return &batcher{l: l, sql: fmt.Sprintf(batchAllowSQL, table, column), size: maxBatchKeys, keys: make(map[string]*entry)}
}

// do decides q, a request of n units on key, in a batch.
func (b *batcher) do(ctx context.Context, key string, n int, q query) (Decision, error) {
	c := &call{key: key, n: n, q: q, done: make(chan struct{})}
	if e := b.submit(c); e != nil {
		// Alone and free to go: the caller's own statement, on its own
		// goroutine, as without the batcher.
		c.d, c.err = b.l.run(ctx, q)
		e.last = c.d
		if next := b.finish([]*entry{e}); next != nil {
			go b.send(next)
		}
		return c.d, c.err
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

// submit adds c to the entry of its key, or to a new one. It returns that
// new entry when c goes alone, now, on its caller's goroutine: fewer than
// inFlightLimit statements run and nothing gathers. The caller then calls
// finish when its statement returns.
func (b *batcher) submit(c *call) (direct *entry) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.keys[c.key] == nil && len(b.open) == 0 && b.inFlight < inFlightLimit {
		e := &entry{key: c.key, n: c.n, calls: []*call{c}, sent: time.Now()}
		b.keys[c.key] = e
		b.inFlight++
		return e
	}
	b.enqueue(c)
	if len(b.open) >= b.size {
		go b.send(b.take())
	}
	return nil
}

// enqueue adds c to the entry of its key: as one more call while the entry
// gathers and has c's cost, else as a waiter for its answer. A key with no
// entry gets a new one in the open batch. It is called with mu held.
func (b *batcher) enqueue(c *call) {
	switch e := b.keys[c.key]; {
	case e == nil:
		e = &entry{key: c.key, n: c.n, calls: []*call{c}}
		b.keys[c.key] = e
		b.open = append(b.open, e)
	case e.sent.IsZero() && e.n == c.n:
		e.calls = append(e.calls, c)
	default:
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

// finish ends the statement that decided bt's entries and settles their
// waiters: refused at once where an entry's answer leaves no room for them,
// else queued in the open batch, together. It returns the open batch when
// it may go now, for the caller to send.
func (b *batcher) finish(bt []*entry) (next []*entry) {
	var refused []*call
	b.mu.Lock()
	b.inFlight--
	for _, e := range bt {
		if b.keys[e.key] == e {
			delete(b.keys, e.key)
		}
	}
	for _, e := range bt {
		for _, w := range e.waiters {
			if w.gone {
				continue
			}
			if d, ok := b.follow(e, w.n); ok {
				w.d = d
				refused = append(refused, w)
			} else {
				b.enqueue(w)
			}
		}
	}
	if len(b.open) > 0 && b.inFlight < inFlightLimit {
		next = b.take()
	}
	b.mu.Unlock()
	for _, w := range refused {
		close(w.done)
	}
	return next
}

// forget makes the next call on key start a new entry: a Reset may have
// changed what the entry on its way read. Calls already waiting for it were
// concurrent with the Reset and may still follow its answer; an entry still
// gathering is sent after the Reset, and stays.
func (b *batcher) forget(key string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	if e := b.keys[key]; e != nil && !e.sent.IsZero() {
		delete(b.keys, key)
	}
	b.mu.Unlock()
}

// follow is the refusal, for a call of n units that waited for e, that e's
// answer implies: ok when the key has no room for the call even now.
func (b *batcher) follow(e *entry, n int) (Decision, bool) {
	if e.last.at == 0 { // not decided by the database: nothing to share
		return Decision{}, false
	}
	return b.l.followGCRA(e.last, n, time.Since(e.sent))
}

// decide runs bt's statement and answers its calls. Its context is the
// limiter's timeout alone: no caller's context may end it for the others.
func (b *batcher) decide(bt []*entry) {
	ctx, cancel := context.WithTimeoutCause(context.Background(), b.l.cfg.Timeout, ErrTimeout)
	defer cancel()
	if len(bt) == 1 && len(bt[0].calls) == 1 {
		e, c := bt[0], bt[0].calls[0]
		c.d, c.err = b.l.run(ctx, c.q)
		if c.err != nil && errors.Is(context.Cause(ctx), ErrTimeout) {
			c.err = fmt.Errorf("%w: %w", ErrTimeout, c.err)
		}
		e.last = c.d
	} else {
		b.decideMany(ctx, bt)
	}
	for _, e := range bt {
		for _, c := range e.calls {
			close(c.done)
		}
	}
}

// decideMany decides bt's entries, on distinct keys, in one statement. An
// entry the statement left undecided (its row locked by a concurrent
// decision, or changed after the statement's snapshot), and every entry
// when the statement fails, is decided by its callers' own statements.
func (b *batcher) decideMany(ctx context.Context, bt []*entry) {
	keys := make([]string, 0, len(bt))
	nT := make([]int64, 0, len(bt))
	tau := make([]int64, 0, len(bt))
	calls := make([]int64, 0, len(bt))
	for _, e := range bt {
		if len(e.calls) == 0 {
			continue
		}
		keys = append(keys, e.key)
		nT = append(nT, int64(e.n)*b.l.emission)
		tau = append(tau, b.l.burstT-int64(e.n)*b.l.emission)
		calls = append(calls, int64(len(e.calls)))
	}
	if len(keys) == 0 {
		return // every caller left before the batch was sent
	}
	var out struct {
		keys              []string
		granted, tat, now []int64
	}
	err := b.l.db.QueryRow(ctx, b.sql, b.l.args.namespace, keys, nT, b.l.args.lockClass, tau, calls).
		Scan(&out.keys, &out.granted, &out.tat, &out.now, nil)
	if err == nil && (len(out.granted) != len(out.keys) || len(out.tat) != len(out.keys) || len(out.now) != len(out.keys)) {
		err = errors.New("batch answer arrays differ in length")
	}
	if err != nil {
		b.mu.Lock()
		b.failures++
		b.mu.Unlock()
	}
	byKey := make(map[string]int, len(out.keys))
	for i, k := range out.keys {
		byKey[k] = i
	}
	for _, e := range bt {
		i, ok := byKey[e.key]
		if err != nil || !ok {
			for _, c := range e.calls {
				c.alone = true
			}
			continue
		}
		// The first granted calls were admitted one after the other, each
		// moving the TAT by its n*T; the rest found no room after them.
		granted, tat, now := int(out.granted[i]), out.tat[i], out.now[i]
		nT := int64(e.n) * b.l.emission
		for j, c := range e.calls {
			if j < granted {
				c.d = b.l.gcraDecision(true, tat-int64(granted-1-j)*nT, now, e.n)
			} else {
				c.d = b.l.gcraDecision(false, tat, now, e.n)
			}
		}
		e.last = e.calls[len(e.calls)-1].d
	}
}

// batchAllowSQL decides many keys of a single GCRA limit at once: $2 the
// keys, $3 and $5 each key's n*T and tau as in upsertAllowSQL, $6 how many
// calls of n units ask for it. It is upsertAllowSQL's statement over a set
// of keys, where each key admits as many of its calls, in order, as fit,
// and it differs in what it does not do:
//
// It never waits for a lock, so one slow key cannot hold back the others
// and no two statements can wait for each other: a row locked by a
// concurrent decision is skipped (SKIP LOCKED), and a new key whose
// advisory lock is held is passed over (pg_try_advisory_xact_lock). Such
// keys, and keys that changed after the snapshot, get no answer row; their
// callers decide them with the limiter's own statement, which waits (Upsert)
// or refuses (NoWait) as it always does.
//
// Its plan cannot degrade as the table grows: every access to the table is
// one key's lookup by the primary key, a LATERAL subquery per key (which
// the planner cannot turn into a join that scans the namespace) or ON
// CONFLICT's own probe of the key. A plain join, or key = ANY($2), lets a
// generic plan made while the table was empty and never analysed scan the
// whole namespace for ever after (TestPlansReachKeysByIndex). The admitted
// rows are written by INSERT ... ON CONFLICT DO UPDATE: the statement holds
// their locks already, so the conflict is certain, and its probe is the
// primary key's.
//
// A refusal, as in the single-key statement, matches no row in locked:
// it takes no lock and writes nothing. A batch of refusals writes nothing.
//
// The answer is one row of arrays (key, calls admitted, TAT µs after them,
// now µs), so the statement runs through QueryRow like every other; the
// fifth column evaluates the admitting branches' setting.
const batchAllowSQL = `
WITH req AS (
    SELECT r.key, r.nt, r.tau, r.calls FROM unnest($2::text[], $3::bigint[], $5::bigint[], $6::bigint[]) AS r(key, nt, tau, calls)
), locked AS (
    SELECT r.key, r.nt, r.tau, r.calls, l.expires_at FROM req AS r CROSS JOIN LATERAL (
        SELECT t.expires_at FROM %[1]s AS t
        WHERE t.namespace = $1 AND t.key = r.key AND t.expires_at <= clock_timestamp() + r.tau * interval '1 microsecond'
        FOR UPDATE OF t SKIP LOCKED
    ) AS l
), stamp AS (
    SELECT l.*, (extract(epoch FROM l.expires_at) * 1000000)::bigint AS tat,
        (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now
    FROM locked AS l
), decided AS (
    SELECT s.key, s.now, greatest(s.tat, s.now) + g.granted * s.nt AS tat, g.granted
    FROM stamp AS s CROSS JOIN LATERAL (
        SELECT least(s.calls, (s.now + s.tau + s.nt - greatest(s.tat, s.now)) / s.nt) AS granted
    ) AS g
    WHERE g.granted > 0
), updated AS (
    INSERT INTO %[1]s AS t (namespace, key, expires_at)
    SELECT $1, d.key, timestamptz 'epoch' + d.tat * interval '1 microsecond' FROM decided AS d
    ON CONFLICT (namespace, key) DO UPDATE SET expires_at = excluded.expires_at
    RETURNING t.key
), current AS (
    SELECT r.key, r.tau, c.tat, c.now FROM req AS r CROSS JOIN LATERAL (
        SELECT (extract(epoch FROM t.expires_at) * 1000000)::bigint AS tat,
            (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now
        FROM %[1]s AS t WHERE t.namespace = $1 AND t.key = r.key
        OFFSET 0
    ) AS c
), first AS (
    SELECT r.key, r.nt, r.tau, r.calls, pg_try_advisory_xact_lock($4::integer, hashtext(r.key)) AS got FROM req AS r
    WHERE NOT EXISTS (SELECT FROM current AS c WHERE c.key = r.key)
    ORDER BY r.key
), fresh AS (
    SELECT f.key, f.now, f.now + f.granted * f.nt AS tat, f.granted FROM (
        SELECT f.key, f.nt, least(f.calls, (f.tau + f.nt) / f.nt) AS granted,
            (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now
        FROM first AS f WHERE f.got
    ) AS f
), inserted AS (
    INSERT INTO %[1]s (namespace, key, expires_at)
    SELECT $1, f.key, timestamptz 'epoch' + f.tat * interval '1 microsecond' FROM fresh AS f
    ORDER BY f.key
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING key
), answer AS (
    SELECT d.key, d.granted, d.tat, d.now, %[2]s AS setting FROM decided AS d
    WHERE EXISTS (SELECT FROM updated AS u WHERE u.key = d.key)
    UNION ALL
    SELECT f.key, f.granted, f.tat, f.now, %[2]s FROM fresh AS f
    WHERE EXISTS (SELECT FROM inserted AS i WHERE i.key = f.key)
    UNION ALL
    SELECT c.key, 0, c.tat, c.now, NULL::text FROM current AS c
    WHERE c.tat > c.now + c.tau AND NOT EXISTS (SELECT FROM updated AS u WHERE u.key = c.key)
)
SELECT array_agg(key), array_agg(granted), array_agg(tat), array_agg(now), max(setting) FROM answer`
