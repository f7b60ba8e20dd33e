package pglimit_test

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
	"github.com/pglimit/cooldown/pglimit/pglimitsql"
)

// deadlineSlack is the stated bound past a call's deadline (its context's,
// or Timeout, whichever comes first): the time to hear the server's error
// or to give up on the connection (docs/operations.md, "Bounds every call
// keeps"). The library returns within milliseconds of the deadline; the
// rest is room for a loaded 2-core machine under the race detector.
const deadlineSlack = 500 * time.Millisecond

// txMargin is how much longer than Timeout a call in the caller's
// transaction (AllowTx, AcquireTx, ReleaseTx) waits for a server that does
// not answer: there the server bounds the wait itself (lock_timeout), so
// that its error leaves the transaction usable, and the client's deadline
// only catches a server gone silent (Limiter.AllowTxN's and the
// Semaphore's docs).
const txMargin = time.Second

// semLevel and semFlow are the priority level (Config.Levels: all of the
// one slot a key has, none lent) and the flow that the semaphore
// target's AcquireLevel, WaitLevel and WaitFlow ask for.
var (
	semLevel = pglimitsem.Level{Name: "level", Min: 1, Max: 1}
	semFlow  = pglimitsem.Flow{Name: "flow", Weight: 1}
)

// mechanism is a configuration whose public entry points the deadline
// tests call.
type mechanism struct {
	name string
	cfg  pglimit.Config
	// api selects the entry points: the limiter's on a pgx pool (""), the
	// limiter's on database/sql ("sql": pglimitsql.DB, its transactions
	// through pglimitsql.Tx), or those of a Semaphore of one slot per key
	// with one priority level, semLevel ("semaphore", which has no cfg).
	api string
}

// mechanisms are limiter configurations that together turn on every
// mechanism a decision can go through: batching and same-key merging (a
// single GCRA limit, whose keys have room left, so that a call waits for
// a locked row rather than being refused by reading it), leases (a fast
// limit with a burst), the general statements, batched too (several
// limits, and per-key limits), and the fallback; then the limiter on database/sql, and the
// Semaphore. Flights, which serve a single limit on Range (a cooldown,
// which has no room for this table's second admission), keep no caller
// past its context either (TestSingleFlightContexts).
var mechanisms = []mechanism{
	{name: "gcra", cfg: pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 100}}}},
	{name: "gcra nowait", cfg: pglimit.Config{Strategy: pglimit.NoWait, Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 100}}}},
	{name: "leases", cfg: pglimit.Config{Limits: []pglimit.Limit{{Rate: 10000, Period: time.Second, Burst: 100}}}},
	{name: "two limits", cfg: pglimit.Config{Limits: []pglimit.Limit{
		{Name: "rate", Rate: 5, Period: time.Minute, Burst: 3},
		{Name: "daily", Algorithm: pglimit.FixedWindow, Rate: 1000, Period: 24 * time.Hour},
	}}},
	{name: "overrides", cfg: pglimit.Config{Namespace: "overrides", Overrides: true, Limits: []pglimit.Limit{{Name: "rate", Rate: 10, Period: time.Second, Burst: 5}}}},
	{name: "fallback", cfg: pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 100}},
		Fallback: &pglimit.Fallback{Limits: []pglimit.Limit{{Rate: 1, Period: time.Second, Burst: 5}}}}},
	{name: "sql", api: "sql", cfg: pglimit.Config{Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 100}}}},
	{name: "semaphore", api: "semaphore"},
}

// target is a mechanism ready for its entry points: its limiter, or its
// semaphore, on a pool of the server under test.
type target struct {
	m        mechanism
	cfg      pglimit.Config // the limiter's, Schema and Timeout set
	lim      pglimit.Limiter
	setup    pglimit.Limiter // decides on the database alone: makes the keys' rows
	sem      *pglimitsem.Semaphore
	setupSem *pglimitsem.Semaphore // sem with the default Timeout: takes the keys' slots
	pool     *pgxpool.Pool         // the limiter's or the semaphore's, and its transactions'
	sqlDB    *sql.DB               // for api "sql": the limiter's, and its transactions'
	// level is, for a limiter whose decisions take ids, a second level
	// for AllowAll on the same table and DB, of the same Timeout (a
	// limit of one unit an hour, burst 100, namespace "level");
	// levelSetup is it with the default Timeout, as setup is lim.
	level, levelSetup pglimit.Limiter
	// commits are, by key, the commits of the caller's transactions
	// begun for the entry points on that key (begin), in order.
	commits map[string][]func(context.Context) error
}

// newTarget builds m's limiter (or semaphore) of timeout on pool, in schema.
func newTarget(t *testing.T, m mechanism, pool *pgxpool.Pool, schema string, timeout time.Duration) *target {
	t.Helper()
	tg := &target{m: m, cfg: m.cfg, pool: pool, commits: map[string][]func(context.Context) error{}}
	tg.cfg.Schema, tg.cfg.Timeout = schema, timeout
	var err error
	switch m.api {
	case "semaphore":
		cfg := pglimitsem.Config{Schema: schema, Slots: 1, Timeout: timeout, Levels: []pglimitsem.Level{semLevel}}
		if tg.sem, err = pglimitsem.New(pool, &cfg); err != nil {
			t.Fatal(err)
		}
		cfg.Timeout = 0 // the setup's: the default, which a loaded machine does not run out of
		if tg.setupSem, err = pglimitsem.New(pool, &cfg); err != nil {
			t.Fatal(err)
		}
		return tg
	case "sql":
		tg.sqlDB = stdlib.OpenDBFromPool(pool) // the pool's settings hold for it too
		t.Cleanup(func() { _ = tg.sqlDB.Close() })
		tg.lim, err = pglimit.New(pglimitsql.DB(tg.sqlDB), &tg.cfg)
	default:
		tg.lim, err = pglimit.New(pool, &tg.cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	setup := tg.cfg
	setup.Fallback, setup.Timeout = nil, 0
	if tg.setup, err = pglimit.New(pool, &setup); err != nil {
		t.Fatal(err)
	}
	if !tg.cfg.Overrides && tg.cfg.Strategy != pglimit.Range { // its decisions take ids
		level := pglimit.Config{Schema: schema, Strategy: tg.cfg.Strategy, Namespace: "level", Timeout: timeout,
			Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 100}}}
		var db pglimit.DB = pool
		if tg.sqlDB != nil {
			db = pglimitsql.DB(tg.sqlDB) // AllowAll's levels share one DB
		}
		if tg.level, err = pglimit.New(db, &level); err != nil {
			t.Fatal(err)
		}
		level.Timeout = 0
		if tg.levelSetup, err = pglimit.New(pool, &level); err != nil {
			t.Fatal(err)
		}
	}
	return tg
}

// table is the table that holds the target's keys.
func (tg *target) table() string {
	if tg.sem != nil {
		return "pglimit_slots"
	}
	return "pglimit_" + string(cmp.Or(tg.cfg.Strategy, pglimit.Upsert))
}

// keyState is what a key holds before the fault: its row, an admission
// of the target's limiter (for Refund), or the semaphore's one slot, held
// (for Extend and Release).
type keyState struct {
	key      string
	admitted pglimit.Decision
	slot     pglimitsem.Slot
}

// ready makes key's row, with per-key limits under Overrides, and the
// admission or slot ep needs, while the server answers: a semaphore's
// key has its one slot held, taken by ep.hold.
func (tg *target) ready(t *testing.T, ep entryPoint, key string) keyState {
	t.Helper()
	ctx := t.Context()
	ks := keyState{key: key}
	if tg.sem != nil {
		hold := ep.hold
		if hold == nil {
			hold = func(ctx context.Context, sem *pglimitsem.Semaphore, key string) (pglimitsem.Slot, error) {
				return sem.Acquire(ctx, key)
			}
		}
		var err error
		if ks.slot, err = hold(ctx, tg.setupSem, key); err != nil || !ks.slot.Acquired {
			t.Fatalf("%s: take its slot: %+v, %v", key, ks.slot, err)
		}
		return ks
	}
	if tg.cfg.Overrides {
		if err := pglimit.SetKeyLimits(ctx, tg.setup, key, pglimit.Limit{Name: "rate", Rate: 10, Burst: 4}); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := tg.setup.Allow(ctx, key); err != nil || !d.Allowed {
		t.Fatalf("%s: first Allow: %+v, %v", key, d, err)
	}
	if tg.levelSetup != nil { // the key's row at AllowAll's second level, which lockKeys locks too
		if d, err := tg.levelSetup.Allow(ctx, key); err != nil || !d.Allowed {
			t.Fatalf("%s: Allow at the second level: %+v, %v", key, d, err)
		}
	}
	// The target's limiter may have a Timeout of 100 ms, which a loaded
	// machine's dial can outlast: testdb.Ready tries again. With a
	// fallback, such a timeout is an answer from the process, which took
	// nothing from the database to refund or settle: it asks again, for
	// up to 30 s, until the database answers. A try that timed out may
	// still commit on the server, and take the units the next one asks
	// for: a refusal starts the key afresh, through the setup limiter.
	err := testdb.Ready(func() (err error) {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			ks.admitted, err = tg.lim.Allow(ctx, key)
			if err == nil && !ks.admitted.Allowed && !ks.admitted.Fallback && time.Now().Before(deadline) {
				if err := tg.setup.Reset(ctx, key); err != nil {
					return err
				}
				if _, err := tg.setup.Allow(ctx, key); err != nil {
					return err
				}
				continue
			}
			if err != nil || !ks.admitted.Fallback || time.Now().After(deadline) {
				return err
			}
		}
	})
	if err != nil || !ks.admitted.Allowed || ks.admitted.Fallback {
		t.Fatalf("%s: second Allow: %+v, %v", key, ks.admitted, err)
	}
	return ks
}

// begin opens a transaction of the target's pool for the calls on key,
// rolled back (within a second: the server may not answer) when the test
// ends unless it was committed before; its commit is appended to
// tg.commits[key].
func (tg *target) begin(t *testing.T, key string) pglimit.DB {
	t.Helper()
	end := func(rollback, commit func(context.Context) error) {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = rollback(ctx)
		})
		tg.commits[key] = append(tg.commits[key], commit)
	}
	if tg.sqlDB != nil {
		tx, err := tg.sqlDB.BeginTx(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		end(func(context.Context) error { return tx.Rollback() }, func(context.Context) error { return tx.Commit() })
		return pglimitsql.Tx(tx)
	}
	tx, err := tg.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	end(tx.Rollback, tx.Commit)
	return tx
}

// input is what a call passes: the key, and the cost n of an entry point
// that takes one.
type input struct {
	key string
	n   int
}

// call is one call of an entry point. local reports an answer given
// without the database, as a lease or a fallback may give one.
type call func(ctx context.Context, in input) (local bool, err error)

// entryPoint is one public call that reaches a key's row.
type entryPoint struct {
	name  string
	inTx  bool // in a caller's transaction: one call at a time, and txMargin
	keyed bool // takes a key; the others take ks's admission or slot
	cost  int  // the cost n it passes by default; 0 if it takes none
	// id: it decides with a decision id, decisionID of its key, which
	// every call of the entry point on that key shares: they are retries
	// of one decision. Such an admission charges tg.lim's key, and with
	// level tg.level's too (AllowAll's second level).
	id, level bool
	// hold, for an entry point of the semaphore, takes the slot of key
	// that ready holds before the fault; nil for Acquire. A key is used
	// either with levels, or with flows, or with neither.
	hold func(ctx context.Context, sem *pglimitsem.Semaphore, key string) (pglimitsem.Slot, error)
	// takes: a call of the semaphore that takes a slot of its key, whose
	// one slot ready holds. Once the fault is over, the key holds that
	// slot alone (checkSlots).
	takes bool
	// queues: a wait of the semaphore, which may join its key's queue.
	// Once the fault is over, and the places of joins cut off are taken
	// out (within Timeout), its key has no place in the queue
	// (checkSlots). joinsFirst: its first statement is the join (Wait),
	// which a frozen server or a dead connection may run after its caller
	// gave up: that place stays until it lapses, as Wait's doc says, so
	// only the locked row checks its key's places. WaitLevel's and
	// WaitFlow's first statement takes a slot without joining.
	queues, joinsFirst bool
	// prepare readies a call on ks while the server answers (a
	// transaction is opened here), or returns nil where the entry point
	// does not apply to tg.
	prepare func(t *testing.T, tg *target, ks keyState) call
}

// input is the entry point's default input on ks.
func (ep entryPoint) input(ks keyState) input { return input{key: ks.key, n: ep.cost} }

// answered is a call's answer for a decision: local when it came from a
// lease or a fallback.
func answered(d pglimit.Decision, err error) (bool, error) {
	return d.Fallback || pglimit.DecisionLeased(d), err
}

// limiterCall is prepare for an entry point of every limiter.
func limiterCall(f func(ctx context.Context, tg *target, ks keyState, in input) (bool, error)) func(*testing.T, *target, keyState) call {
	return func(_ *testing.T, tg *target, ks keyState) call {
		if tg.lim == nil {
			return nil
		}
		return func(ctx context.Context, in input) (bool, error) { return f(ctx, tg, ks, in) }
	}
}

// semCall is prepare for an entry point of the semaphore.
func semCall(f func(ctx context.Context, sem *pglimitsem.Semaphore, ks keyState, in input) error) func(*testing.T, *target, keyState) call {
	return func(_ *testing.T, tg *target, ks keyState) call {
		if tg.sem == nil {
			return nil
		}
		return func(ctx context.Context, in input) (bool, error) { return false, f(ctx, tg.sem, ks, in) }
	}
}

// semWait is prepare for a wait of the semaphore. A wait is bounded by its
// context alone: here by Timeout too, as a caller who wants that bound
// gives it.
func semWait(f func(ctx context.Context, sem *pglimitsem.Semaphore, key string) error) func(*testing.T, *target, keyState) call {
	return func(_ *testing.T, tg *target, _ keyState) call {
		if tg.sem == nil {
			return nil
		}
		return func(ctx context.Context, in input) (bool, error) {
			ctx, cancel := context.WithTimeoutCause(ctx, tg.cfg.Timeout, pglimit.ErrTimeout)
			defer cancel()
			return false, f(ctx, tg.sem, in.key)
		}
	}
}

// holdLevel and holdFlow are entryPoint.hold for the semaphore's calls of
// semLevel and of semFlow.
func holdLevel(ctx context.Context, sem *pglimitsem.Semaphore, key string) (pglimitsem.Slot, error) {
	return sem.AcquireLevel(ctx, key, semLevel.Name)
}

func holdFlow(ctx context.Context, sem *pglimitsem.Semaphore, key string) (pglimitsem.Slot, error) {
	return sem.WaitFlow(ctx, key, semFlow)
}

// reserves reports whether tg's limiter takes reservations (Reserve and
// WaitN): a single GCRA limit.
func (tg *target) reserves() bool {
	return tg.lim != nil && len(tg.cfg.Limits) == 1 && tg.cfg.Limits[0].Algorithm == pglimit.GCRA
}

// entryPoints are every public call of a limiter and a semaphore that
// reaches a key's row.
var entryPoints = []entryPoint{
	{name: "Allow", keyed: true, prepare: limiterCall(func(ctx context.Context, tg *target, _ keyState, in input) (bool, error) {
		return answered(tg.lim.Allow(ctx, in.key))
	})},
	{name: "AllowN", keyed: true, cost: 2, prepare: limiterCall(func(ctx context.Context, tg *target, _ keyState, in input) (bool, error) {
		return answered(tg.lim.AllowN(ctx, in.key, in.n))
	})},
	{name: "AllowTxN", inTx: true, keyed: true, cost: 1, prepare: func(t *testing.T, tg *target, ks keyState) call {
		if tg.lim == nil {
			return nil
		}
		tx := tg.begin(t, ks.key)
		return func(ctx context.Context, in input) (bool, error) {
			_, err := tg.lim.AllowTxN(ctx, tx, in.key, in.n)
			return false, err
		}
	}},
	{name: "AllowAtMost", keyed: true, cost: 2, prepare: limiterCall(func(ctx context.Context, tg *target, _ keyState, in input) (bool, error) {
		return answered(tg.lim.AllowAtMost(ctx, in.key, in.n))
	})},
	{name: "Reserve", keyed: true, cost: 1, prepare: func(t *testing.T, tg *target, ks keyState) call {
		if !tg.reserves() {
			return nil
		}
		return limiterCall(func(ctx context.Context, tg *target, _ keyState, in input) (bool, error) {
			return answered(tg.lim.Reserve(ctx, in.key, in.n, time.Hour))
		})(t, tg, ks)
	}},
	{name: "WaitN", keyed: true, cost: 1, prepare: func(t *testing.T, tg *target, ks keyState) call {
		if !tg.reserves() {
			return nil
		}
		return limiterCall(func(ctx context.Context, tg *target, _ keyState, in input) (bool, error) {
			d, err := pglimit.WaitN(ctx, tg.lim, in.key, in.n)
			if err != nil && d.Limit.Rate > 0 {
				// A refusal, which WaitN returns with an error wrapping
				// context.DeadlineExceeded (the units come after ctx's
				// deadline): an answer, as NoWait gives a locked row at once.
				err = nil
			}
			return answered(d, err)
		})(t, tg, ks)
	}},
	{name: "Peek", keyed: true, cost: 1, prepare: limiterCall(func(ctx context.Context, tg *target, _ keyState, in input) (bool, error) {
		_, err := tg.lim.Peek(ctx, in.key, in.n)
		return false, err
	})},
	{name: "Refund", cost: 1, prepare: limiterCall(func(ctx context.Context, tg *target, ks keyState, in input) (bool, error) {
		_, err := tg.lim.Refund(ctx, ks.admitted, in.n)
		if errors.Is(err, pglimit.ErrUnsupported) || errors.Is(err, pglimit.ErrInvalidCost) {
			// Units served from a lease, or the admission's units reserved
			// by a concurrent refund or counted as given back by one whose
			// outcome is unknown: no statement.
			return true, nil
		}
		return false, err
	})},
	{name: "Settle", cost: 3, prepare: limiterCall(func(ctx context.Context, tg *target, ks keyState, in input) (bool, error) {
		_, err := pglimit.Settle(ctx, tg.lim, ks.admitted, in.n)
		if errors.Is(err, pglimit.ErrUnsupported) || errors.Is(err, pglimit.ErrAlreadySettled) {
			// Units served from a lease, or an admission another call
			// settles: no statement.
			return true, nil
		}
		return false, err
	})},
	{name: "Reset", keyed: true, prepare: limiterCall(func(ctx context.Context, tg *target, _ keyState, in input) (bool, error) {
		return false, tg.lim.Reset(ctx, in.key)
	})},
	{name: "SetKeyLimits", keyed: true, prepare: func(t *testing.T, tg *target, _ keyState) call {
		if !tg.cfg.Overrides {
			return nil
		}
		return func(ctx context.Context, in input) (bool, error) {
			return false, pglimit.SetKeyLimits(ctx, tg.lim, in.key, pglimit.Limit{Name: "rate", Rate: 20, Burst: 5})
		}
	}},
	{name: "AllowAll", keyed: true, cost: 1, prepare: func(t *testing.T, tg *target, ks keyState) call {
		if tg.lim == nil || tg.cfg.Strategy == pglimit.Range {
			return nil
		}
		return limiterCall(func(ctx context.Context, tg *target, _ keyState, in input) (bool, error) {
			_, err := pglimit.AllowAll(ctx, in.n, pglimit.Charge{Limiter: tg.lim, Key: in.key})
			return false, err
		})(t, tg, ks)
	}},
	{name: "AllowAllTx", inTx: true, keyed: true, cost: 1, prepare: func(t *testing.T, tg *target, ks keyState) call {
		if tg.lim == nil || tg.cfg.Strategy == pglimit.Range {
			return nil
		}
		tx := tg.begin(t, ks.key)
		return func(ctx context.Context, in input) (bool, error) {
			_, err := pglimit.AllowAllTx(ctx, tx, in.n, pglimit.Charge{Limiter: tg.lim, Key: in.key})
			return false, err
		}
	}},
	{name: "Pause", keyed: true, prepare: func(t *testing.T, tg *target, ks keyState) call {
		if tg.lim == nil || tg.cfg.Strategy == pglimit.Range || tg.cfg.Overrides || len(tg.cfg.Limits) > 1 ||
			len(tg.cfg.Limits) == 1 && tg.cfg.Limits[0].Algorithm != pglimit.GCRA {
			return nil
		}
		return limiterCall(func(ctx context.Context, tg *target, _ keyState, in input) (bool, error) {
			return false, pglimit.Pause(ctx, tg.lim, in.key, time.Millisecond)
		})(t, tg, ks)
	}},
	{name: "Inspect", keyed: true, prepare: func(t *testing.T, tg *target, _ keyState) call {
		if tg.lim == nil || tg.cfg.Strategy == pglimit.Range || tg.m.api == "sql" {
			return nil
		}
		return func(ctx context.Context, in input) (bool, error) {
			_, err := pglimit.Inspect(ctx, tg.lim, in.key)
			return false, err
		}
	}},
	{name: "SetKeyLimitsFor", keyed: true, prepare: func(t *testing.T, tg *target, _ keyState) call {
		if !tg.cfg.Overrides {
			return nil
		}
		return func(ctx context.Context, in input) (bool, error) {
			return false, pglimit.SetKeyLimitsFor(ctx, tg.lim, in.key, time.Hour, pglimit.Limit{Name: "rate", Rate: 20, Burst: 5})
		}
	}},
	{name: "Acquire", keyed: true, takes: true, prepare: semCall(func(ctx context.Context, sem *pglimitsem.Semaphore, _ keyState, in input) error {
		_, err := sem.Acquire(ctx, in.key)
		return err
	})},
	{name: "Wait", keyed: true, takes: true, queues: true, joinsFirst: true, prepare: semWait(func(ctx context.Context, sem *pglimitsem.Semaphore, key string) error {
		_, err := sem.Wait(ctx, key)
		return err
	})},
	{name: "AcquireLevel", keyed: true, takes: true, hold: holdLevel, prepare: semCall(func(ctx context.Context, sem *pglimitsem.Semaphore, _ keyState, in input) error {
		_, err := sem.AcquireLevel(ctx, in.key, semLevel.Name)
		return err
	})},
	// WaitLevel's first try takes a slot in one statement, without
	// joining, while no waiter of its level is queued, as here: under a
	// frozen server or a dead connection that try is the statement cut
	// off; under a locked row it is refused, and the call joins the queue
	// and tries in turn until its deadline.
	{name: "WaitLevel", keyed: true, takes: true, queues: true, hold: holdLevel, prepare: semWait(func(ctx context.Context, sem *pglimitsem.Semaphore, key string) error {
		_, err := sem.WaitLevel(ctx, key, semLevel.Name)
		return err
	})},
	// WaitFlow's first try, with no one waiting, takes a free slot
	// without joining; refused, it joins and tries in turn in one
	// statement.
	{name: "WaitFlow", keyed: true, takes: true, queues: true, hold: holdFlow, prepare: semWait(func(ctx context.Context, sem *pglimitsem.Semaphore, key string) error {
		_, err := sem.WaitFlow(ctx, key, semFlow)
		return err
	})},
	{name: "AcquireTx", inTx: true, keyed: true, takes: true, prepare: func(t *testing.T, tg *target, ks keyState) call {
		if tg.sem == nil {
			return nil
		}
		tx := tg.begin(t, ks.key)
		return func(ctx context.Context, in input) (bool, error) {
			_, err := tg.sem.AcquireTx(ctx, tx, in.key)
			return false, err
		}
	}},
	{name: "Extend", prepare: semCall(func(ctx context.Context, sem *pglimitsem.Semaphore, ks keyState, _ input) error {
		_, err := sem.Extend(ctx, ks.slot)
		return err
	})},
	{name: "Release", prepare: semCall(func(ctx context.Context, sem *pglimitsem.Semaphore, ks keyState, _ input) error {
		return sem.Release(ctx, ks.slot)
	})},
	{name: "ReleaseTx", inTx: true, prepare: func(t *testing.T, tg *target, ks keyState) call {
		if tg.sem == nil {
			return nil
		}
		tx := tg.begin(t, ks.key)
		return func(ctx context.Context, _ input) (bool, error) { return false, tg.sem.ReleaseTx(ctx, tx, ks.slot) }
	}},
}

// decisionID is the decision id of the calls of an id entry point on key.
func decisionID(key string) string { return "id/" + key }

// withID is ep called with a decision id, on a limiter whose decisions
// take ids.
func withID(ep entryPoint) entryPoint {
	prepare := ep.prepare
	ep.name, ep.id = ep.name+" id", true
	ep.prepare = func(t *testing.T, tg *target, ks keyState) call {
		if tg.level == nil {
			return nil
		}
		f := prepare(t, tg, ks)
		if f == nil {
			return nil
		}
		return func(ctx context.Context, in input) (bool, error) {
			return f(pglimit.WithID(ctx, decisionID(in.key)), in)
		}
	}
	return ep
}

// withCost is ep with the cost n.
func withCost(ep entryPoint, n int) entryPoint {
	ep.cost = n
	return ep
}

// entryPointNamed is the entry point of entryPoints named name.
func entryPointNamed(name string) entryPoint {
	i := slices.IndexFunc(entryPoints, func(ep entryPoint) bool { return ep.name == name })
	return entryPoints[i]
}

// idEntryPoints are the entry points of a limiter that take a decision id
// (pglimit.WithID), each called with one: Allow's, AllowN's, AllowTxN's
// (in the caller's transaction), AllowAtMost's and Reserve's statements,
// WaitN's reservation, and AllowAll's on two levels, which stores the id
// at each. A decision with an id goes to the database on its own
// statement: no batch, lease, pre-block or fallback answers it.
var idEntryPoints = []entryPoint{
	withID(entryPointNamed("Allow")),
	withCost(withID(entryPointNamed("AllowN")), 1), // within "two limits"' burst, which ready leaves 1
	withID(entryPointNamed("AllowTxN")),
	withID(entryPointNamed("AllowAtMost")),
	withID(entryPointNamed("Reserve")),
	withID(entryPointNamed("WaitN")),
	{name: "AllowAll id", keyed: true, cost: 1, id: true, level: true, prepare: func(_ *testing.T, tg *target, _ keyState) call {
		if tg.level == nil {
			return nil
		}
		return func(ctx context.Context, in input) (bool, error) {
			_, err := pglimit.AllowAll(pglimit.WithID(ctx, decisionID(in.key)), in.n,
				pglimit.Charge{Limiter: tg.lim, Key: in.key}, pglimit.Charge{Limiter: tg.level, Key: in.key})
			return false, err
		}
	}},
}

// deadlineCase is one mechanism under one bound, its calls ready: every
// entry point twice, five calls at once each time (calls that meet on a
// key merge, and a busy key of a fast limit leases), or one at a time in a
// caller's transaction.
type deadlineCase struct {
	name    string
	tg      *target
	bound   time.Duration // the calls' deadline: their context's, or Timeout
	timeout bool          // the bound is Timeout, under a long context
	want    error         // the error of a call that does not decide in time
	entries []readyEntry

	calls atomic.Int64 // calls made
	// latest is the most a call took past its bound, and latestCall
	// that call (its entry point).
	mu         sync.Mutex
	latest     time.Duration
	latestCall string
}

// logCalls logs how many calls cases made and how late the latest
// returned past its bound (its deadline; for a call in a caller's
// transaction under Timeout, txMargin later).
func logCalls(t *testing.T, cases ...*deadlineCase) {
	var calls int64
	var latest time.Duration
	var which string
	for _, c := range cases {
		calls += c.calls.Load()
		c.mu.Lock()
		if c.latest > latest || which == "" {
			latest, which = c.latest, c.name+": "+c.latestCall
		}
		c.mu.Unlock()
	}
	t.Logf("%d calls; the latest returned %s past its bound (%s)", calls, latest.Round(time.Millisecond), which)
}

type readyEntry struct {
	name                      string
	inTx                      bool
	id, level                 bool // entryPoint's
	takes, queues, joinsFirst bool // entryPoint's
	in                        input
	rounds                    [2][]call
	before                    []int // for an id entry point, the key's remaining units before the fault (remaining)
	// retry, for an id entry point, is the call again after the fault, as
	// its caller would retry it: in a caller's transaction, a new one,
	// committed.
	retry call
	// answered counts the calls that returned no error.
	answered *atomic.Int64
	slot     pglimitsem.Slot // for the semaphore, the key's slot that ready holds
}

// newDeadlineCase readies every entry point of m on pool, in schema, with
// a 100 ms bound: the caller's context (bound "context") or Timeout
// (bound "Timeout", under a 5 s context). Its keys are named after it.
func newDeadlineCase(t *testing.T, m mechanism, bound string, pool *pgxpool.Pool, schema string) *deadlineCase {
	t.Helper()
	return newDeadlineCaseOf(t, m, bound, pool, schema, append(entryPoints[:len(entryPoints):len(entryPoints)], idEntryPoints...))
}

// newDeadlineCaseOf is newDeadlineCase of the entry points eps alone.
func newDeadlineCaseOf(t *testing.T, m mechanism, bound string, pool *pgxpool.Pool, schema string, eps []entryPoint) *deadlineCase {
	t.Helper()
	c := &deadlineCase{name: m.name + "/" + bound, bound: 100 * time.Millisecond, want: context.DeadlineExceeded}
	timeout := 2 * time.Second
	if bound == "Timeout" {
		c.timeout, c.want, timeout = true, pglimit.ErrTimeout, c.bound
	}
	c.tg = newTarget(t, m, pool, schema, timeout)
	for _, ep := range eps {
		ks := c.tg.ready(t, ep, c.name+"/"+ep.name)
		e := readyEntry{name: ep.name, inTx: ep.inTx, id: ep.id, level: ep.level, in: ep.input(ks),
			takes: ep.takes, queues: ep.queues, joinsFirst: ep.joinsFirst, answered: new(atomic.Int64), slot: ks.slot}
		width := 5
		if ep.inTx {
			width = 1
		}
		for r := range e.rounds {
			for range width {
				f := ep.prepare(t, c.tg, ks)
				if f == nil {
					break
				}
				e.rounds[r] = append(e.rounds[r], f)
			}
		}
		if e.rounds[0] != nil {
			if e.id {
				e.before = c.tg.remaining(t, e.in.key)
				e.retry = e.rounds[0][0]
				if ep.inTx {
					e.retry = c.tg.committed(t, ep, ks)
				}
			}
			c.entries = append(c.entries, e)
		}
	}
	return c
}

// committed is a call of ep, an entry point in a caller's transaction,
// on a transaction of its own that it begins (ep.prepare) and commits.
func (tg *target) committed(t *testing.T, ep entryPoint, ks keyState) call {
	return func(ctx context.Context, in input) (bool, error) {
		f := ep.prepare(t, tg, ks)
		commits := tg.commits[ks.key]
		if _, err := f(ctx, in); err != nil {
			return false, err
		}
		return false, commits[len(commits)-1](ctx)
	}
}

// endTxs ends the caller's transactions begun for key, each committed
// where the fault left it usable (its call failed in a savepoint that was
// rolled back), else rolled back, as its caller would. It returns how
// many committed.
func (tg *target) endTxs(key string) (committed int) {
	for _, commit := range tg.commits[key] {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if commit(ctx) == nil {
			committed++
		}
		cancel()
	}
	return committed
}

// remaining is what key has left, by Peek, at tg's limiter and at its
// second level.
func (tg *target) remaining(t *testing.T, key string) []int {
	t.Helper()
	var left []int
	for _, lim := range []pglimit.Limiter{tg.setup, tg.levelSetup} {
		d, err := lim.Peek(t.Context(), key, 1)
		if err != nil {
			t.Fatalf("%s: Peek: %v", key, err)
		}
		left = append(left, d.Remaining)
	}
	return left
}

// steady reports whether limits give no unit back during a test (each a
// GCRA limit of one unit an hour or slower), so that a key's remaining
// units change only by what is charged.
func steady(limits []pglimit.Limit) bool {
	for _, l := range limits {
		if l.Algorithm != pglimit.GCRA || l.Period < time.Duration(l.Rate)*time.Hour {
			return false
		}
	}
	return true
}

// checkIDs checks, once the fault is over, the outcome of the case's
// calls with a decision id: each id was charged at most once, never once
// per call. A retry of each, the same call with the same id, is admitted
// (replayed if a call during the fault was admitted, its outcome unknown
// to its caller, else afresh), and then the id has one row at each level
// it charges, and the key, where its limits give no unit back meanwhile
// (steady), is charged its cost once at each, as the database's record
// shows. It returns how many ids calls during the fault stored.
func (c *deadlineCase) checkIDs(t *testing.T) (stored int) {
	t.Helper()
	ids := pgx.Identifier{c.tg.cfg.Schema, "pglimit_ids"}.Sanitize()
	rows := func(id string) int {
		var n int
		if err := c.tg.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+ids+" WHERE id = $1", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, e := range c.entries {
		if !e.id {
			continue
		}
		id, levels := decisionID(e.in.key), 1
		if e.level {
			levels = 2
		}
		if e.inTx {
			// The callers' transactions end, committed where they can be:
			// a call that failed there was rolled back to its savepoint,
			// and stored no id and charged nothing, even committed.
			committed := c.tg.endTxs(e.in.key)
			if e.answered.Load() == 0 {
				if n := rows(id); n > 0 {
					t.Errorf("%s: %s: id %q has %d rows once its callers' transactions ended (%d of them committed), though every call failed: recorded as admitted",
						c.name, e.name, id, n, committed)
				}
				if left := c.tg.remaining(t, e.in.key); steady(c.tg.cfg.Limits) && !slices.Equal(left, e.before) {
					t.Errorf("%s: %s: the key has %v left once its callers' transactions ended (%d of them committed), %v before: a failed call charged it",
						c.name, e.name, left, committed, e.before)
				}
			}
		}
		if rows(id) > 0 {
			stored++
		}
		// The limiter's Timeout may be 100 ms: testdb.Ready tries again.
		err := testdb.Ready(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := e.retry(ctx, e.in)
			return err
		})
		if err != nil {
			t.Errorf("%s: %s: a retry of id %q after the fault: %v", c.name, e.name, id, err)
			continue
		}
		if n := rows(id); n != levels {
			t.Errorf("%s: %s: id %q has %d rows after its retry, want %d (one a level)", c.name, e.name, id, n, levels)
		}
		if !steady(c.tg.cfg.Limits) {
			continue
		}
		after := c.tg.remaining(t, e.in.key)
		cost := max(e.in.n, 1)
		want := []int{cost, 0}
		if e.level {
			want[1] = cost
		}
		for i := range want {
			if charged := e.before[i] - after[i]; charged != want[i] {
				t.Errorf("%s: %s: id %q charged %d units at level %d (before %d, after %d), want %d: once",
					c.name, e.name, id, charged, i, e.before[i], after[i], want[i])
			}
		}
	}
	return stored
}

// keys returns the keys of the case's entry points.
func (c *deadlineCase) keys() []string {
	keys := make([]string, len(c.entries))
	for i, e := range c.entries {
		keys[i] = e.in.key
	}
	return keys
}

// run makes the case's calls and checks that each returned by its bound
// plus deadlineSlack (plus txMargin for a call in a caller's transaction
// bounded by Timeout), with an error wrapping want, or an answer; with
// serverDown, only a lease or a fallback may answer. The calls of an entry
// point run at once, entry point after entry point; those in a caller's
// transaction, each on a transaction of its own, run all at once beside
// them. It may run on any goroutine.
func (c *deadlineCase) run(t *testing.T, serverDown bool) {
	check := func(e readyEntry, f call) {
		limit := c.bound
		if e.inTx && c.timeout {
			limit += txMargin
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if !c.timeout {
			ctx, cancel = context.WithTimeout(context.Background(), c.bound)
		}
		defer cancel()
		start := time.Now()
		local, err := f(ctx, e.in)
		took := time.Since(start)
		c.calls.Add(1)
		if err == nil {
			e.answered.Add(1)
		}
		c.mu.Lock()
		if late := took - limit; late > c.latest || c.latestCall == "" {
			c.latest, c.latestCall = late, e.name
		}
		c.mu.Unlock()
		switch {
		case took > limit+deadlineSlack:
			t.Errorf("%s: %s returned after %s, deadline %s (err %v)", c.name, e.name, took.Round(time.Millisecond), limit, err)
		case err == nil && serverDown && !local:
			t.Errorf("%s: %s answered with the server down", c.name, e.name)
		case local && e.id:
			t.Errorf("%s: %s answered without the database, which alone knows the id", c.name, e.name)
		case err != nil && !errors.Is(err, c.want):
			t.Errorf("%s: %s: %v, want an error wrapping %v", c.name, e.name, err, c.want)
		}
	}
	var inTx, round sync.WaitGroup
	for _, e := range c.entries {
		for _, calls := range e.rounds {
			for _, f := range calls {
				if e.inTx {
					inTx.Go(func() { check(e, f) })
				} else {
					round.Go(func() { check(e, f) })
				}
			}
			round.Wait()
		}
	}
	inTx.Wait()
}

// deadlineCases readies every mechanism under both bounds on pools that
// newPool returns, in schema.
func deadlineCases(t *testing.T, newPool func() *pgxpool.Pool, schema string) []*deadlineCase {
	t.Helper()
	var cases []*deadlineCase
	for _, m := range mechanisms {
		for _, bound := range []string{"context", "Timeout"} {
			cases = append(cases, newDeadlineCase(t, m, bound, newPool(), schema))
		}
	}
	return cases
}

// runAll runs every case at once: under a fault of the whole server, the
// cases' calls then wait together, as an application's would.
func runAll(t *testing.T, cases []*deadlineCase) {
	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Go(func() { c.run(t, true) })
	}
	wg.Wait()
}

// checkAfterFault is checkIDs and checkSlots of every case, once the
// fault is over and the statements its calls sent have ended on the
// server (testdb.Quiesce; the cases' pools set the application_name app),
// and logs how many ids calls during the fault stored: admissions whose
// callers got an error, their outcome unknown to them (a statement the
// client gave up on goes on waiting on the server, and may commit once
// the fault ends). serverFault: the fault was the server's (frozen, or a
// dead connection), not a locked row.
func checkAfterFault(t *testing.T, app string, serverFault bool, cases ...*deadlineCase) {
	t.Helper()
	pools := make([]*pgxpool.Pool, len(cases))
	for i, c := range cases {
		pools[i] = c.tg.pool
	}
	testdb.Quiesce(t, app, pools...)
	stored := 0
	for _, c := range cases {
		stored += c.checkIDs(t)
		c.checkSlots(t, serverFault)
	}
	t.Logf("after the fault: %d ids stored by calls whose callers got an error; each id checked charged once", stored)
}

// checkSlots checks, once the fault is over, what the semaphore's calls
// left behind. The key of each wait has no place in its queue, once the
// places of joins cut off are taken out, within Timeout (it is polled
// for Timeout and deadlineSlack); after a server fault, that of a wait
// whose first statement does not join (not joinsFirst). Unless a call of
// the case returned Timeout or more past its bound: then a leave, one
// statement bounded by Timeout, may have timed out, and its place lapses
// at its expiry instead. The key of each
// call that takes a slot holds the one slot ready took and no other: its
// Release succeeds, and then the key holds none.
func (c *deadlineCase) checkSlots(t *testing.T, serverFault bool) {
	t.Helper()
	if c.tg.sem == nil {
		return
	}
	count := func(table, cond, key string) int {
		var n int
		q := "SELECT count(*) FROM " + pgx.Identifier{c.tg.cfg.Schema, table}.Sanitize() + " WHERE key = $1" + cond
		if err := c.tg.pool.QueryRow(t.Context(), q, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	held := func(key string) int { return count("pglimit_slots", " AND expires_at > now()", key) }
	for _, e := range c.entries {
		key := e.in.key
		if e.queues && (!serverFault || !e.joinsFirst) {
			places := 0
			for deadline := time.Now().Add(c.tg.cfg.Timeout + deadlineSlack); ; time.Sleep(20 * time.Millisecond) {
				if places = count("pglimit_slot_waiters", "", key); places == 0 || time.Now().After(deadline) {
					break
				}
			}
			c.mu.Lock()
			latest := c.latest
			c.mu.Unlock()
			switch {
			case places == 0:
			case latest >= c.tg.cfg.Timeout:
				// A wait that gives up leaves its place in one statement
				// bounded by Timeout, before it returns: a call that
				// returned that late may have had its leave time out on
				// a loaded machine. The place then lapses at its expiry,
				// which the queue already skips.
				t.Logf("%s: %s: key %q has %d places in its queue after the fault: a leave may have timed out (a call returned %s past its bound)",
					c.name, e.name, key, places, latest.Round(time.Millisecond))
			default:
				t.Errorf("%s: %s: key %q has %d places in its queue after the fault, want none: a wait that gave up left its place",
					c.name, e.name, key, places)
			}
		}
		if !e.takes {
			continue
		}
		if n := held(key); n != 1 {
			t.Errorf("%s: %s: key %q holds %d slots after the fault, want the one ready took", c.name, e.name, key, n)
		}
		if err := c.tg.setupSem.Release(t.Context(), e.slot); err != nil {
			t.Errorf("%s: %s: Release of key %q's slot that ready took: %v; want it still held", c.name, e.name, key, err)
		}
		if n := held(key); n != 0 {
			t.Errorf("%s: %s: key %q holds %d slots once the slot ready took is released, want none: a call took one", c.name, e.name, key, n)
		}
	}
}

// lockKeys holds the rows of keys in schema's table (each key must have
// one), and their per-key limits' rows where they have them, in one
// transaction of its own until the test ends or the returned function is
// called.
func lockKeys(t *testing.T, pool *pgxpool.Pool, schema, table string, keys ...string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(release)
	var n int
	q := "SELECT count(DISTINCT key) FROM (SELECT key FROM " + pgx.Identifier{schema, table}.Sanitize() + " WHERE key = ANY($1) FOR UPDATE) AS l"
	if err := tx.QueryRow(ctx, q, keys).Scan(&n); err != nil || n != len(keys) {
		t.Fatalf("lock the rows of %q: %d of %d keys, %v", keys, n, len(keys), err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{schema, "pglimit_overrides"}.Sanitize()+" WHERE key = ANY($1) FOR UPDATE", keys); err != nil {
		t.Fatal(err)
	}
	return release
}

// The deadline invariant, under a key's row locked by a long transaction:
// no entry point, with any mechanism on, returns later than its context's
// deadline plus deadlineSlack, and one that does not decide in time says
// so with the context's error, or ErrTimeout when Timeout came first.
// The entry points with a decision id (idEntryPoints) lock the key's row
// first, at every level (lockKeys holds AllowAll's second level's too),
// before they write the id's row in pglimit_ids, which has none yet: the
// key's row is what they wait for here, and TestDeadlineHeldID holds the
// id instead. Once the rows are free, each id is charged once, and a
// failed AllowTxN with an id left nothing in its caller's transaction,
// which commits (checkIDs); the semaphore's waits left no place in the
// queue, and its key's slot held before is still the one held
// (checkSlots).
func TestDeadlineLockedRow(t *testing.T) {
	t.Parallel()
	for _, m := range mechanisms {
		for _, bound := range []string{"context", "Timeout"} {
			t.Run(m.name+"/"+bound, func(t *testing.T) {
				t.Parallel()
				app := testdb.AppName(t)
				pool := testdb.AppPool(t, bigPoolConfig(t, 16), app)
				c := newDeadlineCase(t, m, bound, pool, testdb.Schema(t))
				unlock := lockKeys(t, pool, c.tg.cfg.Schema, c.tg.table(), c.keys()...)
				c.run(t, false)
				logCalls(t, c)
				unlock()
				checkAfterFault(t, app, false, c)
			})
		}
	}
}

// The deadline invariant on a server stopped with SIGSTOP while calls run
// (a host that stops answering: connections stay open, new ones are
// accepted by the kernel and never answered): every entry point of every
// mechanism returns by its bound plus deadlineSlack, as under a locked
// row, and none answers unless a lease or the fallback may. Once the
// server goes on, each id is charged once (checkIDs), none by a call in
// a caller's transaction, and the semaphore's keys are as checkSlots
// says.
func TestDeadlineFrozenServer(t *testing.T) {
	testdb.Slow(t)
	srv := testdb.OwnMigratedServer(t)
	app := testdb.AppName(t)
	cases := deadlineCases(t, func() *pgxpool.Pool { return testdb.AppPool(t, testdb.ServerPoolConfig(t, srv, 12), app) }, "public")
	thaw := testdb.Frozen(t, srv)
	runAll(t, cases)
	logCalls(t, cases...)
	thaw()
	checkAfterFault(t, app, true, cases...)
}

// The deadline invariant on a dead connection: every connection to the
// server, those in the pools and those dialled during the calls, goes
// silent (the bytes sent are never delivered), and every entry point of
// every mechanism returns by its bound plus deadlineSlack. Once the bytes
// flow again, the ids and the semaphore's keys are checked as after a
// frozen server.
func TestDeadlineDeadConnection(t *testing.T) {
	t.Parallel()
	proxy, pcfg := testdb.NewStallProxy(t)
	pcfg.MaxConns = 12
	pcfg.ConnConfig.RuntimeParams["search_path"] = ""
	app := testdb.AppName(t)
	cases := deadlineCases(t, func() *pgxpool.Pool { return testdb.AppPool(t, pcfg, app) }, testdb.Schema(t))
	proxy.Stall()
	t.Cleanup(proxy.Unstall) // before the pools close and the transactions roll back
	runAll(t, cases)
	logCalls(t, cases...)
	// The statements held back reach the server now, after their callers
	// gave up: an admission among them commits unknown to its caller.
	proxy.Unstall()
	checkAfterFault(t, app, true, cases...)
}

// The deadline invariant of a decision whose id another transaction
// holds: its row inserted in pglimit_ids, at every level, by an AllowTx
// with the same id, not yet committed, while the keys' rows are free.
// Every entry point with an id waits for that transaction (the id's
// primary key) and returns by its bound plus deadlineSlack, with the
// context's error or ErrTimeout; once the transaction rolls back, each id
// is charged once, none by a call in a caller's transaction (checkIDs).
func TestDeadlineHeldID(t *testing.T) {
	t.Parallel()
	for _, m := range mechanisms {
		if m.api == "semaphore" || m.cfg.Overrides {
			continue // takes no decision ids
		}
		for _, bound := range []string{"context", "Timeout"} {
			t.Run(m.name+"/"+bound, func(t *testing.T) {
				t.Parallel()
				app := testdb.AppName(t)
				pool := testdb.AppPool(t, bigPoolConfig(t, 16), app)
				c := newDeadlineCaseOf(t, m, bound, pool, testdb.Schema(t), idEntryPoints)
				if len(c.entries) == 0 {
					t.Fatalf("%s: no entry point with an id applies", m.name)
				}
				release := holdIDs(t, c)
				c.run(t, false)
				logCalls(t, c)
				release()
				checkAfterFault(t, app, false, c)
			})
		}
	}
}

// holdIDs has a transaction of its own take the decision id of each of
// c's entry points with an id, at every level it charges, by AllowTx on
// another key, and keep it uncommitted until the test ends or the
// returned function is called, which rolls it back.
func holdIDs(t *testing.T, c *deadlineCase) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := c.tg.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	release = sync.OnceFunc(func() { _ = tx.Rollback(ctx) })
	t.Cleanup(release)
	for _, e := range c.entries {
		lims := []pglimit.Limiter{c.tg.setup}
		if e.level {
			lims = append(lims, c.tg.levelSetup)
		}
		for _, lim := range lims {
			id := decisionID(e.in.key)
			if d, err := lim.AllowTx(pglimit.WithID(ctx, id), tx, "holder/"+id); err != nil || !d.Allowed || d.Replayed {
				t.Fatalf("hold id %q: %+v, %v", id, d, err)
			}
		}
	}
	return release
}

// One key whose row a long transaction holds keeps no other key of its
// batch waiting: a key freed after 600 ms is decided then, while the held
// one is still waited for.
func TestBatchSlowKeyHoldsNoOther(t *testing.T) {
	t.Parallel()
	pool := bigPool(t, 16)
	lim, schema := newBatchLimiter(t, pool, pglimit.Upsert, func(c *pglimit.Config) {
		c.Limits, c.Cooldown = []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 10}}, 0
	})
	keys := []string{"fill-1", "fill-2", "slow", "quick"}
	for _, k := range keys {
		if _, err := lim.Allow(t.Context(), k); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"fill-1", "fill-2", "slow"} {
		lockKeys(t, pool, schema, "pglimit_upsert", k)
	}
	freeQuick := lockKeys(t, pool, schema, "pglimit_upsert", "quick")
	// The two fillers hold the statements in flight, so that the next two
	// calls gather in one batch, sent when the fillers give up.
	var wg sync.WaitGroup
	for _, k := range keys[:2] {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			_, _ = lim.Allow(ctx, k)
		})
	}
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	wg.Go(func() {
		if _, err := lim.Allow(t.Context(), "slow"); !errors.Is(err, pglimit.ErrTimeout) {
			t.Errorf("slow: %v, want ErrTimeout", err)
		}
	})
	var quick time.Duration
	wg.Go(func() {
		d, err := lim.Allow(t.Context(), "quick")
		quick = time.Since(start)
		if err != nil || !d.Allowed {
			t.Errorf("quick: %+v, %v; want it admitted", d, err)
		}
	})
	time.Sleep(600 * time.Millisecond)
	freeQuick()
	wg.Wait()
	// The slow key's wait ends at Timeout, 2 s after the batch was sent.
	if quick > time.Second+deadlineSlack {
		t.Errorf("the quick key was decided after %s, behind the slow one; its row was free after 600 ms", quick.Round(time.Millisecond))
	}
}

// A lock_timeout or statement_timeout that the server enforces (a default
// of the database or role) is ErrTimeout, as the limiter's own is.
func TestServerTimeoutIsErrTimeout(t *testing.T) {
	t.Parallel()
	for _, setting := range []string{"lock_timeout", "statement_timeout"} {
		for _, m := range mechanisms {
			if m.cfg.Strategy == pglimit.NoWait || m.api != "" {
				continue // a lock it cannot have at once is a refusal; the others have their own tests
			}
			t.Run(fmt.Sprintf("%s/%s", setting, m.name), func(t *testing.T) {
				t.Parallel()
				pcfg, err := pgxpool.ParseConfig(testdb.URL(t))
				if err != nil {
					t.Fatal(err)
				}
				pcfg.ConnConfig.RuntimeParams["search_path"] = ""
				pcfg.ConnConfig.RuntimeParams[setting] = "300ms"
				pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				cfg := m.cfg
				cfg.Schema, cfg.Fallback = testdb.Schema(t), nil
				lim, err := pglimit.New(pool, &cfg)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := lim.Allow(t.Context(), "k"); err != nil {
					t.Fatal(err)
				}
				setKeyLimits := func(ctx context.Context) error {
					return pglimit.SetKeyLimits(ctx, lim, "k", pglimit.Limit{Name: "rate", Rate: 20})
				}
				if cfg.Overrides {
					if err := setKeyLimits(t.Context()); err != nil { // the row to lock
						t.Fatal(err)
					}
				}
				lockKeys(t, bigPool(t, 2), cfg.Schema, "pglimit_upsert", "k")
				if _, err := lim.Allow(t.Context(), "k"); !errors.Is(err, pglimit.ErrTimeout) {
					t.Errorf("Allow on a locked row under the server's %s: %v, want ErrTimeout", setting, err)
				}
				if err := lim.Reset(t.Context(), "k"); !errors.Is(err, pglimit.ErrTimeout) {
					t.Errorf("Reset of a locked row under the server's %s: %v, want ErrTimeout", setting, err)
				}
				if err := setKeyLimits(t.Context()); cfg.Overrides && !errors.Is(err, pglimit.ErrTimeout) {
					t.Errorf("SetKeyLimits of a locked row under the server's %s: %v, want ErrTimeout", setting, err)
				}
			})
		}
	}
}

// unknownOutcome reports whether err is a call's error that says its
// outcome is unknown, as Allow's does: ErrUnavailable, saying so.
func unknownOutcome(err error) bool {
	return errors.Is(err, pglimit.ErrUnavailable) && strings.Contains(err.Error(), "outcome is unknown")
}

// At-most-once charging. Every commit waits for a synchronous standby
// that never comes, and each backend that waits is terminated
// (testdb.SyncRepFault). The database's record then shows each caller charged
// at most once: a batch whose statement may have committed is never run
// again by its callers, for one limit or several.
func TestChargedAtMostOnce(t *testing.T) {
	testdb.Slow(t)
	ctx := t.Context()
	srv := testdb.OwnServer(t)
	admin := testdb.ServerPool(t, srv, 2)
	pool := testdb.ServerPool(t, srv, 16)
	if err := pglimit.Migrate(ctx, admin, "public"); err != nil {
		t.Fatal(err)
	}
	burst := 1000
	// One GCRA limit (batch.allow), and the same beside a daily window
	// (batch.general), whose binding limit stays the GCRA one.
	for _, limits := range [][]pglimit.Limit{
		{{Rate: 1, Period: time.Hour, Burst: burst}},
		{{Name: "rate", Rate: 1, Period: time.Hour, Burst: burst}, {Name: "day", Rate: 10 * burst, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow}},
	} {
		t.Run(fmt.Sprintf("%d limits", len(limits)), func(t *testing.T) {
			lim, err := pglimit.New(pool, &pglimit.Config{Limits: limits})
			if err != nil {
				t.Fatal(err)
			}
			stop := testdb.SyncRepFault(t, admin)
			keys := []string{"a", "b", "c", "d"}
			var (
				mu       sync.Mutex
				callers  = map[string]int{}
				admitted = map[string]int{}
				failed   int
				wg       sync.WaitGroup
			)
			for i := range 64 {
				key := keys[i%len(keys)]
				wg.Go(func() {
					d, err := lim.Allow(ctx, key)
					mu.Lock()
					defer mu.Unlock()
					callers[key]++
					switch {
					case err != nil:
						if failed++; failed <= 3 {
							t.Logf("%s: %v", key, err)
						}
					case d.Allowed:
						admitted[key]++
					}
				})
			}
			wg.Wait()
			terminated := stop()
			if terminated == 0 {
				t.Fatal("no backend was terminated while its commit waited: the test proves nothing")
			}
			for _, key := range keys {
				d, err := lim.Peek(ctx, key, 1)
				if err != nil {
					t.Fatal(err)
				}
				charged := burst - 1 - d.Remaining // Peek's Remaining counts its own unit as taken
				t.Logf("key %s: %d callers, %d admitted, %d units charged", key, callers[key], admitted[key], charged)
				if charged > callers[key] || charged < admitted[key] {
					t.Errorf("key %s: %d units charged for %d callers (%d admitted); each caller is charged at most once", key, charged, callers[key], admitted[key])
				}
			}
			t.Logf("%d backends terminated at their commit; %d callers got an error", terminated, failed)
		})
	}
}

// At-most-once settling and pausing, under TestChargedAtMostOnce's fault
// (testdb.SyncRepFault). Settle: 64 admissions of one unit on 4 keys, made
// before the fault, are settled at a cost of 6 during it; each key is then
// charged 5 units for each settle that succeeded and at most 5 for each
// that failed, never twice, every failed settle's error says its outcome
// is unknown, and settling that decision again is ErrAlreadySettled.
// Pause: 64 pauses of 10 minutes on 4 keys; a pause never lengthens by
// being applied twice (each key's wait is at most 10 minutes), a key
// whose pause succeeded is paused, and every failed pause's error says
// its outcome is unknown.
func TestSettleAndPauseChargedAtMostOnce(t *testing.T) {
	testdb.Slow(t)
	ctx := t.Context()
	srv := testdb.OwnServer(t)
	admin := testdb.ServerPool(t, srv, 2)
	pool := testdb.ServerPool(t, srv, 16)
	if err := pglimit.Migrate(ctx, admin, "public"); err != nil {
		t.Fatal(err)
	}
	const burst, calls = 1000, 64
	keys := []string{"a", "b", "c", "d"}
	newLim := func(t *testing.T, ns string) pglimit.Limiter {
		lim, err := pglimit.New(pool, &pglimit.Config{Namespace: ns, Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: burst}}})
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}
	// failedCall checks the error of a call that may have been applied.
	var logged atomic.Int32
	failedCall := func(t *testing.T, what string, err error) {
		if logged.Add(1) <= 3 {
			t.Logf("%s: %v", what, err)
		}
		if !unknownOutcome(err) {
			t.Errorf("%s: %v; want ErrUnavailable, saying the outcome is unknown", what, err)
		}
	}

	t.Run("Settle", func(t *testing.T) {
		const extra = 5
		lim := newLim(t, "settle")
		decisions := make([]pglimit.Decision, calls)
		for i := range decisions {
			d, err := lim.Allow(ctx, keys[i%len(keys)])
			if err != nil || !d.Allowed {
				t.Fatalf("Allow before the fault: %+v, %v", d, err)
			}
			decisions[i] = d
		}
		var (
			mu               sync.Mutex
			settled, unknown = map[string]int{}, map[string]int{}
			wg               sync.WaitGroup
		)
		stop := testdb.SyncRepFault(t, admin)
		for i, d := range decisions {
			key := keys[i%len(keys)]
			wg.Go(func() {
				s, err := pglimit.Settle(ctx, lim, d, 1+extra)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && s.Charged == extra:
					settled[key]++
				case err == nil:
					t.Errorf("Settle at 1+%d of a unit: %+v; want %d charged", extra, s, extra)
				default:
					unknown[key]++
					failedCall(t, "Settle of "+key, err)
					if _, err := pglimit.Settle(ctx, lim, d, 1+extra); !errors.Is(err, pglimit.ErrAlreadySettled) {
						t.Errorf("Settle again after a Settle whose outcome is unknown: %v; want ErrAlreadySettled", err)
					}
				}
			})
		}
		wg.Wait()
		if stop() == 0 {
			t.Fatal("no backend was terminated while its commit waited: the test proves nothing")
		}
		for _, key := range keys {
			d, err := lim.Peek(ctx, key, 1)
			if err != nil {
				t.Fatal(err)
			}
			admitted := calls / len(keys)
			charged := burst - 1 - d.Remaining - admitted // Peek's Remaining counts its own unit as taken
			t.Logf("key %s: %d settles, %d failed; %d units charged by them", key, settled[key]+unknown[key], unknown[key], charged)
			if charged < extra*settled[key] || charged > extra*(settled[key]+unknown[key]) || charged%extra != 0 {
				t.Errorf("key %s: settles charged %d units; %d settles of %d each succeeded and %d failed: each settle charges once or not at all",
					key, charged, settled[key], extra, unknown[key])
			}
		}
	})

	t.Run("Pause", func(t *testing.T) {
		const pause = 10 * time.Minute
		lim := newLim(t, "pause")
		var (
			mu     sync.Mutex
			paused = map[string]int{}
			wg     sync.WaitGroup
		)
		start := time.Now()
		stop := testdb.SyncRepFault(t, admin)
		for i := range calls {
			key := keys[i%len(keys)]
			wg.Go(func() {
				err := pglimit.Pause(ctx, lim, key, pause)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failedCall(t, "Pause of "+key, err)
					return
				}
				paused[key]++
			})
		}
		wg.Wait()
		if stop() == 0 {
			t.Fatal("no backend was terminated while its commit waited: the test proves nothing")
		}
		for _, key := range keys {
			d, err := lim.Peek(ctx, key, 1)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("key %s: %d pauses succeeded; the key waits %s", key, paused[key], d.RetryAfter)
			if d.RetryAfter > pause {
				t.Errorf("key %s waits %s after pauses of %s: a pause applied twice lengthened it", key, d.RetryAfter, pause)
			}
			if paused[key] > 0 && d.RetryAfter < pause-time.Since(start) {
				t.Errorf("key %s waits %s, less than its pause of %s less the %s since it began", key, d.RetryAfter, pause, time.Since(start))
			}
		}
	})
}

// errorClass is a way for a call to fail, for TestTypedErrors.
type errorClass struct {
	name string
	// params are session settings that every connection the calls take
	// has, as a database or role default would set them.
	params map[string]string
	// lock: another transaction holds every table locked during the calls.
	lock bool
	// inputs are the calls' bad inputs for ep on tg; nil means the
	// default input, none means ep is not called.
	inputs func(ep entryPoint, tg *target, ks keyState) []input
	// want is the sentinel the call's error wraps; nil when the call
	// succeeds.
	want func(ep entryPoint) error
	// outage: the class is one the fallback and leases answer.
	outage bool
}

// badKeys are keys every entry point refuses before the database.
var badKeys = map[string]string{"empty": "", "257 bytes": strings.Repeat("k", pglimit.MaxKeyLength+1), "not UTF-8": "caf\xc3", "NUL": "a\x00b"}

var errorClasses = []errorClass{
	{name: "invalid key", want: always(pglimit.ErrInvalidKey), inputs: func(ep entryPoint, _ *target, ks keyState) []input {
		if !ep.keyed {
			return []input{}
		}
		var in []input
		for _, k := range badKeys {
			in = append(in, input{key: k, n: ep.cost})
		}
		return in
	}},
	{name: "invalid cost", want: always(pglimit.ErrInvalidCost), inputs: func(ep entryPoint, tg *target, ks keyState) []input {
		costs := []int{0, -1, math.MaxInt, tg.capacity() + 1}
		switch {
		case ep.cost == 0:
			return []input{}
		case ep.name == "AllowAtMost": // grants what it can of any n
			costs = costs[:2]
		case ep.name == "Refund": // past what the admission took
			costs[3] = ks.admitted.Granted + 1
		case ep.name == "Settle": // any real cost, charged up to the debt cap
			costs = costs[1:3]
		case ep.name == "Reserve": // queues past the burst, up to its maxDelay
			costs = costs[:3]
		case ep.name == "WaitN" && tg.cfg.Overrides:
			// Refuses past the configured limits' burst; past a key's
			// own, Reserve queues it.
			costs = costs[:3]
		}
		in := make([]input, len(costs))
		for i, n := range costs {
			in[i] = input{key: ks.key, n: n}
		}
		return in
	}},
	{name: "lock_timeout", params: map[string]string{"lock_timeout": "300ms"}, lock: true, want: always(pglimit.ErrTimeout), outage: true},
	{name: "statement_timeout", params: map[string]string{"statement_timeout": "300ms"}, lock: true, want: always(pglimit.ErrTimeout), outage: true},
	{name: "read-only", params: map[string]string{"default_transaction_read_only": "on"}, outage: true, want: func(ep entryPoint) error {
		if ep.name == "Peek" || ep.name == "Inspect" {
			return nil // they work on a standby
		}
		return pglimit.ErrReadOnly
	}},
}

func always(err error) func(entryPoint) error { return func(entryPoint) error { return err } }

// capacity is the most units a cost may ask of the target's keys at once:
// the tightest limit's burst or quota, a key's own under Overrides.
func (tg *target) capacity() int {
	if tg.cfg.Overrides {
		return 4 // ready's per-key limits
	}
	c := math.MaxInt
	for _, l := range tg.cfg.Limits {
		if l.Algorithm == pglimit.GCRA {
			c = min(c, cmp.Or(l.Burst, 1))
		} else {
			c = min(c, l.Rate)
		}
	}
	return c
}

// settablePool is a pool that sets, once asked to, session settings on
// every connection a caller takes.
func settablePool(t *testing.T, maxConns int32) (*pgxpool.Pool, func(params map[string]string)) {
	t.Helper()
	cfg := bigPoolConfig(t, maxConns)
	var set atomic.Pointer[map[string]string]
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if p := set.Load(); p != nil {
			for k, v := range *p {
				if _, err := c.Exec(ctx, "SELECT set_config($1, $2, false)", k, v); err != nil {
					return false, err
				}
			}
		}
		return true, nil
	}
	return openPool(t, cfg), func(params map[string]string) { set.Store(&params) }
}

// Typed errors: every error an entry point returns, for every mechanism,
// wraps the exported sentinel of its cause, and the call changes nothing.
// The causes: an invalid key (empty, 257 bytes, not UTF-8, NUL) or cost
// (0, -1, math.MaxInt, past the burst or quota, past what an admission
// took), both refused before the database; the server's lock_timeout and
// statement_timeout (ErrTimeout); a server that cannot write (ErrReadOnly;
// Peek still answers). Where the database is unavailable the fallback may
// answer in its place, and a lease may have answered already.
func TestTypedErrors(t *testing.T) {
	t.Parallel()
	for _, class := range errorClasses {
		t.Run(class.name, func(t *testing.T) {
			t.Parallel()
			schema := testdb.Schema(t)
			type ready struct {
				ep    entryPoint
				tg    *target
				ks    keyState
				in    []input
				calls []call // one per input
			}
			var all []ready
			var setters []func(map[string]string)
			for _, m := range mechanisms {
				if class.lock && m.cfg.Strategy == pglimit.NoWait {
					continue // a lock it cannot have at once is a refusal
				}
				pool, set := settablePool(t, 12)
				setters = append(setters, set)
				tg := newTarget(t, m, pool, schema, time.Second)
				for _, ep := range entryPoints {
					ks := tg.ready(t, ep, m.name+"/"+ep.name)
					in := []input{ep.input(ks)}
					if class.inputs != nil {
						in = class.inputs(ep, tg, ks)
					}
					all = append(all, ready{ep: ep, tg: tg, ks: ks, in: in})
				}
			}
			for _, set := range setters {
				set(class.params)
			}
			// The calls are readied once the settings hold: a transaction
			// is read-only from its start.
			plain := testdb.Pool(t)
			for i := range all {
				r := &all[i]
				for range r.in {
					f := r.ep.prepare(t, r.tg, r.ks)
					if f == nil {
						break
					}
					r.calls = append(r.calls, f)
				}
			}
			before := limiterRows(t, plain, schema)
			unlock := func() {}
			if class.lock {
				unlock = lockTables(t, schema)
			}
			var wg sync.WaitGroup
			var calls atomic.Int64
			defer func() { t.Logf("%d calls", calls.Load()) }()
			for _, r := range all {
				for i, f := range r.calls {
					wg.Go(func() {
						calls.Add(1)
						in := r.in[i]
						local, err := f(t.Context(), in)
						want := class.want(r.ep)
						what := fmt.Sprintf("%s: %s(%q, %d)", r.tg.m.name, r.ep.name, in.key, in.n)
						switch {
						case local && err == nil && (class.outage || r.ep.name == "Refund" || r.ep.name == "Settle"):
							// The fallback or a lease answered; a Refund
							// or Settle of leased units is ErrUnsupported,
							// and one of an admission settled already is
							// ErrAlreadySettled.
						case want == nil && err != nil:
							t.Errorf("%s: %v, want an answer", what, err)
						case want != nil && !errors.Is(err, want):
							t.Errorf("%s: %v, want an error wrapping %v", what, err, want)
						}
					})
				}
			}
			wg.Wait()
			unlock()
			if after := limiterRows(t, plain, schema); after != before {
				t.Errorf("the calls changed the tables:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// limiterRows is every row of schema's tables that the mechanisms write,
// as text.
func limiterRows(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	var b strings.Builder
	for _, table := range []string{"pglimit_upsert", "pglimit_nowait", "pglimit_overrides", "pglimit_slots"} {
		var s string
		q := "SELECT coalesce(string_agg(t::text, ' ' ORDER BY t::text), '') FROM " + pgx.Identifier{schema, table}.Sanitize() + " AS t"
		if err := pool.QueryRow(context.Background(), q).Scan(&s); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s: %s\n", table, s)
	}
	return b.String()
}

// lockTables has a transaction of its own hold every table the mechanisms
// use in schema locked against everything, until the returned function or
// the test's end.
func lockTables(t *testing.T, schema string) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := testdb.Pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	unlock = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(unlock)
	for _, table := range []string{"pglimit_upsert", "pglimit_nowait", "pglimit_overrides", "pglimit_slots"} {
		if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{schema, table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
	}
	return unlock
}

// A database that cannot be reached is ErrUnavailable from every entry
// point that reaches it, the limiter's, AllowAll (with and without an
// id), SetKeyLimits and the Semaphore's: a pool to a port where nothing
// listens.
func TestUnavailableIsTyped(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@"+addr+"/none?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg := pglimit.Config{Namespace: "unavailable", Overrides: true, Limits: []pglimit.Limit{{Name: "rate", Rate: 10, Period: time.Second, Burst: 5}}}
	lim, err := pglimit.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	single, err := pglimit.New(pool, &pglimit.Config{Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	sem, err := pglimitsem.New(pool, &pglimitsem.Config{Slots: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	calls := map[string]func() error{
		"Allow (batched)": func() error { _, err := single.Allow(ctx, "k"); return err },
		"AllowN":          func() error { _, err := lim.AllowN(ctx, "k", 2); return err },
		"AllowAtMost":     func() error { _, err := lim.AllowAtMost(ctx, "k", 2); return err },
		"Reserve":         func() error { _, err := lim.Reserve(ctx, "k", 1, time.Second); return err },
		"Peek":            func() error { _, err := lim.Peek(ctx, "k", 1); return err },
		"Reset":           func() error { return lim.Reset(ctx, "k") },
		"SetKeyLimits":    func() error { return pglimit.SetKeyLimits(ctx, lim, "k", pglimit.Limit{Name: "rate", Rate: 20}) },
		"Acquire":         func() error { _, err := sem.Acquire(ctx, "k"); return err },
		"AllowAll":        func() error { _, err := pglimit.AllowAll(ctx, 1, pglimit.Charge{Limiter: lim, Key: "k"}); return err },
		"AllowAll id": func() error {
			_, err := pglimit.AllowAll(pglimit.WithID(ctx, "id"), 1, pglimit.Charge{Limiter: single, Key: "k"})
			return err
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, pglimit.ErrUnavailable) {
			t.Errorf("%s with nothing listening: %v, want an error wrapping ErrUnavailable", name, err)
		}
	}
}
