package pglimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// batcher coalesces concurrent Allow and AllowN calls of one limiter in
// one process into one statement that decides many keys and commits once,
// so that they share a round trip, a transaction and a WAL flush. It is
// used only for a single GCRA limit (a cooldown among them) on Upsert and
// NoWait; everything else bypasses it. All methods are safe on a nil
// *batcher, which is batching turned off.
//
// While fewer than batchesInFlight of the limiter's statements run, a call
// runs its own single-key statement at once, on its own goroutine: under a
// light load the batcher adds a mutex and nothing else. Otherwise the call
// joins the open batch, which is sent when one of the running statements
// returns, when it holds BatchSize keys, or when its first call has waited
// BatchWindow, whichever comes first. So a call waits at most BatchWindow
// before its statement is sent.
//
// A batch decides each key once. A second call on a key already in the
// batch follows the first one, as single-flight does: it is refused without
// a round trip if the first call's answer shows that the key has no room
// for it, and joins the next batch otherwise. A batch of one key runs the
// limiter's own single-key statement.
//
// The batcher has no goroutine of its own: a batch runs on a goroutine
// that ends with its statement, so there is nothing to close, and a batch
// whose callers have all returned still ends within Config.Timeout.
type batcher struct {
	l      *stmtLimiter
	window time.Duration
	size   int
	sql    string

	mu       sync.Mutex
	open     *batch // collecting calls; nil when none is pending
	inFlight int

	// failures counts batch statements that failed (their keys were then
	// decided one by one); tests read it.
	failures int64
}

// batchesInFlight is how many of a limiter's statements (single or batch)
// may run at once before new calls gather in a batch. Eight keep a few
// server processes per core busy; more statements at once only queue in
// the server, where one statement over many keys costs less CPU and WAL
// flushes than as many statements over one key each (measured in
// docs/throughput.md).
const batchesInFlight = 8

type batch struct {
	calls []*call
	keys  map[string]struct{}
	timer *time.Timer
	taken bool // sent, or being sent: no call joins it
}

// call is one Allow waiting for its batch. Its fields are written before
// done is closed, and read after.
type call struct {
	key  string
	n    int
	q    query
	done chan struct{}

	gone bool // the caller returned (its context ended); guarded by mu

	d     Decision
	err   error
	alone bool // the batch could not decide it: the caller runs its own statement
}

// newBatcher returns l's batcher, or nil when l does not batch: batching
// is off, or l is not a single GCRA limit on Upsert or NoWait. table and
// column fill batchAllowSQL as they fill the single-key statements.
func newBatcher(l *stmtLimiter, table, column string) *batcher {
	if !l.cfg.Batch || !l.single || l.cfg.Strategy == Range {
		return nil
	}
	return &batcher{l: l, window: l.cfg.BatchWindow, size: l.cfg.BatchSize, sql: fmt.Sprintf(batchAllowSQL, table, column)}
}

// runBatched decides q, a request of n units on key, in a batch when l
// batches, else with its own statement. A table Citus distributes is not
// batched once the limiter knows it (its first statement finds out): a
// batch's keys live on different nodes, and each decision there is one hop
// to its own. A batch sent before that fails there, and its calls are
// decided by their own statements.
func (l *stmtLimiter) runBatched(ctx context.Context, key string, n int, q query) (Decision, error) {
	if l.batch == nil || l.dist.Load() != nil {
		return l.run(ctx, q)
	}
	return l.batch.do(ctx, key, n, q)
}

// do decides q, a request of n units on key, in a batch.
func (b *batcher) do(ctx context.Context, key string, n int, q query) (Decision, error) {
	c := &call{key: key, n: n, q: q, done: make(chan struct{})}
	if b.submit(c) {
		// Alone and free to go: the caller's own statement, on its own
		// goroutine, as without the batcher.
		defer b.release()
		return b.l.run(ctx, q)
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		// A call still waiting for its batch leaves it and changes
		// nothing; one already sent is decided anyway, as a single
		// statement cancelled in flight may be.
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

// submit adds c to the open batch and sends it if it may go now. It
// reports whether c goes alone, now, on its caller's goroutine: no batch
// is pending and fewer than batchesInFlight statements run; the caller then
// calls release when its statement returns.
func (b *batcher) submit(c *call) (direct bool) {
	b.mu.Lock()
	if c.gone {
		b.mu.Unlock()
		return false
	}
	if b.open == nil && b.inFlight < batchesInFlight {
		b.inFlight++
		b.mu.Unlock()
		return true
	}
	bt := b.open
	if bt == nil {
		bt = &batch{keys: make(map[string]struct{})}
		b.open = bt
	}
	bt.calls = append(bt.calls, c)
	bt.keys[c.key] = struct{}{}
	var send *batch
	switch {
	case b.inFlight < batchesInFlight || len(bt.keys) >= b.size:
		send = b.take(bt)
	case bt.timer == nil:
		bt.timer = time.AfterFunc(b.window, func() { b.expire(bt) })
	}
	b.mu.Unlock()
	if send != nil {
		go b.send(send)
	}
	return false
}

// release ends a statement sent by submit's caller, and sends the batch
// that filled meanwhile, if any.
func (b *batcher) release() {
	b.mu.Lock()
	b.inFlight--
	var send *batch
	if b.open != nil {
		send = b.take(b.open)
	}
	b.mu.Unlock()
	if send != nil {
		go b.send(send)
	}
}

// take marks bt sent. It is called with mu held.
func (b *batcher) take(bt *batch) *batch {
	bt.taken = true
	if bt.timer != nil {
		bt.timer.Stop()
	}
	if b.open == bt {
		b.open = nil
	}
	b.inFlight++
	return bt
}

// expire sends bt when its window has passed, unless it has gone already.
func (b *batcher) expire(bt *batch) {
	b.mu.Lock()
	if bt.taken {
		b.mu.Unlock()
		return
	}
	b.take(bt)
	b.mu.Unlock()
	b.send(bt)
}

// send decides bt, then sends the batch that filled meanwhile, if any.
func (b *batcher) send(bt *batch) {
	for bt != nil {
		b.decide(bt)
		b.mu.Lock()
		b.inFlight--
		bt = nil
		if b.open != nil {
			bt = b.take(b.open)
		}
		b.mu.Unlock()
	}
}

// decide runs bt's statement and answers its calls. Its context is the
// limiter's timeout alone: no caller's context may end it for the others.
func (b *batcher) decide(bt *batch) {
	b.mu.Lock()
	leads := make(map[string]*call, len(bt.keys))
	var order, follow []*call
	for _, c := range bt.calls {
		switch _, dup := leads[c.key]; {
		case c.gone:
		case dup:
			follow = append(follow, c)
		default:
			leads[c.key] = c
			order = append(order, c)
		}
	}
	b.mu.Unlock()
	if len(order) == 0 {
		return
	}

	ctx, cancel := context.WithTimeoutCause(context.Background(), b.l.cfg.Timeout, ErrTimeout)
	defer cancel()
	sent := time.Now()
	if len(order) == 1 {
		c := order[0]
		c.d, c.err = b.l.run(ctx, c.q)
		if c.err != nil && errors.Is(context.Cause(ctx), ErrTimeout) {
			c.err = fmt.Errorf("%w: %w", ErrTimeout, c.err)
		}
	} else {
		b.decideMany(ctx, order)
	}
	for _, c := range order {
		close(c.done)
	}
	for _, f := range follow {
		lead := leads[f.key]
		switch {
		case lead.alone || lead.err != nil:
			f.alone = true
		default:
			d, refused := b.l.followGCRA(lead.d, f.n, time.Since(sent))
			if !refused {
				if !b.submit(f) { // room left: the next batch decides it
					continue
				}
				b.release() // or, with no batch pending, its caller's own statement
				f.alone = true
			}
			f.d = d
		}
		close(f.done)
	}
}

// decideMany decides calls, on distinct keys, in one statement. A key the
// statement left undecided (its row locked by a concurrent decision, or
// changed after the statement's snapshot), and every key when the statement
// fails, is decided by its caller's own statement.
func (b *batcher) decideMany(ctx context.Context, calls []*call) {
	keys := make([]string, len(calls))
	nT := make([]int64, len(calls))
	tau := make([]int64, len(calls))
	for i, c := range calls {
		keys[i] = c.key
		nT[i] = int64(c.n) * b.l.emission
		tau[i] = b.l.burstT - nT[i]
	}
	var out struct {
		keys     []string
		admitted []bool
		tat, now []int64
	}
	err := b.l.db.QueryRow(ctx, b.sql, b.l.args.namespace, keys, nT, b.l.args.lockClass, tau).
		Scan(&out.keys, &out.admitted, &out.tat, &out.now, nil)
	if err == nil && (len(out.admitted) != len(out.keys) || len(out.tat) != len(out.keys) || len(out.now) != len(out.keys)) {
		err = errors.New("batch answer arrays differ in length")
	}
	if err != nil {
		b.mu.Lock()
		b.failures++
		b.mu.Unlock()
		for _, c := range calls {
			c.alone = true
		}
		return
	}
	byKey := make(map[string]int, len(out.keys))
	for i, k := range out.keys {
		byKey[k] = i
	}
	for _, c := range calls {
		i, ok := byKey[c.key]
		if !ok {
			c.alone = true
			continue
		}
		c.d = b.l.gcraDecision(out.admitted[i], out.tat[i], out.now[i], c.n)
	}
}

// batchAllowSQL decides many keys of a single GCRA limit at once: $2 the
// keys, $3 and $5 each key's n*T and tau as in upsertAllowSQL. It is
// upsertAllowSQL's statement over a set of keys, and differs in what it
// does not do:
//
// It never waits for a lock, so one slow key cannot hold back the others
// and no two statements can wait for each other: a row locked by a
// concurrent decision is skipped (SKIP LOCKED), and a new key whose
// advisory lock is held is passed over (pg_try_advisory_xact_lock). Such
// keys, and keys that changed after the snapshot, get no answer row; their
// callers decide them with the limiter's own statement, which waits (Upsert)
// or refuses (NoWait) as it always does. Rows are still locked in one order
// (ORDER BY key), and the advisory locks are taken in that order too.
//
// A refusal, as in the single-key statement, matches no row in locked:
// it takes no lock and writes nothing. A batch of refusals writes nothing.
//
// The answer is one row of arrays (key, admitted, TAT µs, now µs), so the
// statement runs through QueryRow like every other; the fifth column
// evaluates the admitting branches' setting.
const batchAllowSQL = `
WITH req AS (
    SELECT r.key, r.nt, r.tau FROM unnest($2::text[], $3::bigint[], $5::bigint[]) AS r(key, nt, tau)
), locked AS (
    SELECT t.key, t.expires_at, r.nt FROM %[1]s AS t JOIN req AS r ON t.key = r.key
    WHERE t.namespace = $1 AND t.expires_at <= clock_timestamp() + r.tau * interval '1 microsecond'
    ORDER BY t.key
    FOR UPDATE OF t SKIP LOCKED
), stamp AS (
    SELECT l.key, l.expires_at, l.nt, clock_timestamp() AS now FROM locked AS l
), updated AS (
    UPDATE %[1]s AS t
    SET expires_at = greatest(s.expires_at, s.now) + s.nt * interval '1 microsecond'
    FROM stamp AS s
    WHERE t.namespace = $1 AND t.key = s.key
    RETURNING t.key, t.expires_at, s.now
), current AS (
    SELECT t.key, t.expires_at, clock_timestamp() AS now FROM %[1]s AS t
    WHERE t.namespace = $1 AND t.key = ANY ($2::text[])
), first AS (
    SELECT r.key, r.nt, pg_try_advisory_xact_lock($4::integer, hashtext(r.key)) AS got FROM req AS r
    WHERE NOT EXISTS (SELECT FROM current AS c WHERE c.key = r.key)
    ORDER BY r.key
), fresh AS (
    SELECT f.key, f.nt, clock_timestamp() AS now FROM first AS f WHERE f.got
), inserted AS (
    INSERT INTO %[1]s (namespace, key, expires_at)
    SELECT $1, f.key, f.now + f.nt * interval '1 microsecond' FROM fresh AS f
    ORDER BY f.key
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING key, expires_at
), answer AS (
    SELECT u.key, true AS admitted, u.expires_at, u.now, %[2]s AS setting FROM updated AS u
    UNION ALL
    SELECT i.key, true, i.expires_at, f.now, %[2]s FROM inserted AS i JOIN fresh AS f ON f.key = i.key
    UNION ALL
    SELECT c.key, false, c.expires_at, c.now, NULL::text FROM current AS c JOIN req AS r ON r.key = c.key
    WHERE c.expires_at > c.now + r.tau * interval '1 microsecond' AND NOT EXISTS (SELECT FROM updated AS u WHERE u.key = c.key)
)
SELECT array_agg(key), array_agg(admitted),
       array_agg((extract(epoch FROM expires_at) * 1000000)::bigint),
       array_agg((extract(epoch FROM now) * 1000000)::bigint), max(setting)
FROM answer`
