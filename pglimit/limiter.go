package pglimit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
	"github.com/pglimit/cooldown/pglimit/internal/batch"
	"github.com/pglimit/cooldown/pglimit/internal/engine"
	"github.com/pglimit/cooldown/pglimit/internal/flights"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
	"github.com/pglimit/cooldown/pglimit/internal/preblock"
)

// limiter is every strategy: each decides in one statement. The
// strategies differ only in their SQL and in which error means "someone
// else is deciding" (see strategy.go).
//
// A single GCRA limit (a cooldown among them) has its own statement, the
// cheapest: the TAT is the row's expires_at. Any other set of limits, and
// AllowAtMost, Reserve and Peek, use the general statement (internal/engine),
// on Upsert and NoWait only.
//
// A statement that returns no row has not decided: a concurrent decision
// changed the key after the statement's snapshot was taken, so the
// statement cannot tell whether it would be admitted. It is run again on a
// fresh snapshot.
type limiter struct {
	db       DB
	cfg      Config
	policy   *Policy                  // shared by every Decision, through Decision.Violated
	preblock *preblock.Cache          // nil when off
	fallback *fallback                // nil when off
	specs    []arith.Limit            // cfg.Limits, as the decision arithmetic reads them
	flights  *flights.Group[Decision] // a single GCRA limit's, where the batcher does not serve it

	// worst is the longest any limit can make a key wait: the RetryAfter
	// of a refusal whose wait the statement could not read.
	worst time.Duration

	// minCapacity is the largest n AllowN accepts: what the tightest limit
	// admits at once.
	minCapacity int

	// lockClass is the key class of the limiter's table and namespace,
	// which its statements' advisory locks share (internal/lockid).
	lockClass int32

	// args holds the statement parameters that never change, boxed once
	// instead of at every decision.
	args struct{ namespace, lockClass, idRetention any }

	// ids are the statements of decisions with an id (engine.IDs); nil where
	// ids are not supported (Range, Overrides).
	ids *engine.IDs

	single    bool          // the limits are one GCRA limit: the fast statement decides
	caps      engine.Shape  // what the capability table reads of it (caps.go)
	table     string        // schema-qualified and quoted
	plain     engine.Decide // on a table of one server
	keySQL    engine.Keys   // what acts on a key beside deciding it
	rangeArgs bool          // the fast statement takes no tau ($5)

	// dist, once check has found the table distributed by Citus, holds the
	// statements that replace plain there (citus.go).
	dist atomic.Pointer[engine.Decide]

	// contended is the SQLSTATE that means a concurrent decision holds the
	// key; it becomes a refusal. Empty when contention raises no error.
	contended string

	// verify, when not nil, checks once that the table can keep the
	// limiter's promise; until it has passed, every decision runs it.
	verify   func(ctx context.Context, db DB) error
	verified atomic.Bool

	// recordAt says when the limiter is to record its policy
	// (policies.go): 0 at its first decision, -1 never again (recorded,
	// under way, or failed for good), else not before this time, in
	// Unix nanoseconds, after a failure that may pass.
	recordAt atomic.Int64
	// recordLogged is set once a failed record has been logged.
	recordLogged atomic.Bool

	batch *batch.Group[Decision] // nil when Allow calls are not batched (batched.go)

	observers observers // Config.Observer, and which events it takes

	// Parameters boxed once: a single GCRA limit's increment and tolerance
	// for one unit.
	oneT, oneTau     any
	emission, burstT int64 // µs: T, and Burst*T
}

var _ Limiter = (*limiter)(nil)

// maxAttempts bounds how often a decision re-runs its statement: after a
// concurrent change to the key (no row) or a serialization failure (40001,
// under a session default of REPEATABLE READ or SERIALIZABLE). A fresh
// snapshot settles either at once unless the key keeps changing, and then
// the request is refused: contention is a refusal, not an error.
const maxAttempts = 3

// stmts returns the statements for the limiter's table.
func (l *limiter) stmts() *engine.Decide {
	if d := l.dist.Load(); d != nil {
		return d
	}
	return &l.plain
}

// withStatements gives l the statements of its strategy on table
// (internal/engine writes them), with contended the SQLSTATE that means
// another decision holds the key ("" for none).
func withStatements(l *limiter, table, contended string) *limiter {
	st := engine.Build(specOf(l.cfg))
	l.plain, l.keySQL, l.ids = st.Decide, st.Keys, st.IDs
	l.single = len(l.cfg.Limits) == 1 && l.cfg.Limits[0].Algorithm == GCRA && !l.cfg.Overrides
	l.table = table
	l.rangeArgs = l.cfg.Strategy == Range
	l.contended = contended
	if l.cfg.Strategy != Range && l.cfg.Overrides {
		// A key's own limits decide what fits, once its statement has
		// read them; no limit of any key admits more than maxRate.
		l.minCapacity = maxRate
	}
	if l.single {
		lim := l.cfg.Limits[0]
		_, _, l.emission, l.burstT = lim.micros()
		l.oneT, l.oneTau = l.emission, l.burstT-l.emission
	}
	l.batch = newBatch(l, st.Batch)
	if l.batch.Leases() && l.cfg.Invalidator != nil {
		register(l.cfg.Invalidator, l.lockClass, l.batch)
	}
	return l
}

// query is one decision's statement: which one (fast, or general in a
// mode), for what key and cost, and how to read its answer.
type query struct {
	key      string
	n, mode  int
	maxDelay int64 // µs, Reserve's
	general  bool
}

// sql is q's statement text, in its own transaction or in a caller's.
func (l *limiter) sql(q query, inTx bool) string {
	s := l.stmts()
	switch {
	case q.general && inTx:
		return s.General.Tx[q.mode]
	case q.general:
		return s.General.Own[q.mode]
	case inTx:
		return s.FastTx
	}
	return s.Fast
}

// allowQuery is the query of AllowN.
func (l *limiter) allowQuery(key string, n int) query {
	if !l.single {
		return l.generalQuery(key, n, modeAllow, 0)
	}
	return query{key: key, n: n}
}

func (l *limiter) generalQuery(key string, n, mode int, maxDelay time.Duration) query {
	return query{key: key, n: n, mode: mode, maxDelay: maxDelay.Microseconds(), general: true}
}

// params is q's statement parameters.
func (l *limiter) params(q query) []any {
	if q.general {
		if q.mode == modeReserve {
			return []any{l.args.namespace, q.key, l.args.lockClass, q.n, q.maxDelay}
		}
		return []any{l.args.namespace, q.key, l.args.lockClass, q.n}
	}
	nT, tau := l.oneT, l.oneTau
	if q.n != 1 {
		nT, tau = arith.GCRACost(q.n, l.emission, l.burstT)
	}
	if l.rangeArgs {
		return []any{l.args.namespace, q.key, nT, l.args.lockClass}
	}
	return []any{l.args.namespace, q.key, nT, l.args.lockClass, tau}
}

// scan reads q's answer. In a caller's transaction (inTx), the extra
// column of an admission is the id of the transaction that wrote it,
// which its refund ticket keeps; elsewhere it is not read.
func (l *limiter) scan(row pgx.Row, q query, inTx bool) (Decision, bool, error) {
	key := q.key
	var xact *string
	var setting any
	if inTx {
		setting = &xact
	}
	if q.general {
		d, decided, err := l.scanGeneral(row, q.n, q.mode, q.maxDelay, setting)
		if d.refund != nil {
			d.refund.key, d.refund.xact = key, xact
		}
		return d, decided, err
	}
	var r struct {
		ok       bool
		tat, now int64
	}
	if err := row.Scan(&r.ok, &r.tat, &r.now, setting); err != nil {
		return Decision{}, false, noRowsAsUndecided(err)
	}
	d := l.withTicket(l.gcraDecision(r.ok, r.tat, r.now, q.n), key, l.cfg.Limits, []int64{r.tat})
	if d.refund != nil {
		d.refund.xact = xact
	}
	return d, true, nil
}

// noRowsAsUndecided turns "no row" into a nil error: the statement did not
// decide.
func noRowsAsUndecided(err error) error {
	if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	return err
}

func (l *limiter) Allow(ctx context.Context, key string) (Decision, error) {
	return l.decide(ctx, request{op: OpAllow, key: key, n: 1, via: allowing}, l.checkCost(1), func(ctx context.Context) (Decision, error) {
		return l.allowN(ctx, key, 1)
	})
}

func (l *limiter) AllowN(ctx context.Context, key string, n int) (Decision, error) {
	return l.decide(ctx, request{op: OpAllowN, key: key, n: n, via: allowing}, l.checkCost(n), func(ctx context.Context) (Decision, error) {
		return l.allowN(ctx, key, n)
	})
}

// allowN decides AllowN on the database: in a batch, or with the calls
// on key that share a statement.
func (l *limiter) allowN(ctx context.Context, key string, n int) (Decision, error) {
	if id, ok := IDFrom(ctx); ok {
		// On its own statement: neither batched nor merged with the
		// key's concurrent calls.
		return l.decideID(ctx, nil, l.allowQuery(key, n), id)
	}
	if l.batch != nil && l.dist.Load() == nil {
		// The batcher merges concurrent calls on one key itself. A table
		// Citus distributes is not batched once the limiter knows it (its
		// first statement finds out): a batch's keys live on different
		// nodes, and each decision there is one hop to its own. A batch
		// sent before that fails there, and its calls are decided by
		// their own statements.
		return l.batch.Do(ctx, key, n)
	}
	q := l.allowQuery(key, n)
	return l.flights.Do(ctx, key, n, func(ctx context.Context) (Decision, error) {
		return l.run(ctx, q)
	}, l.followGCRA)
}

func (l *limiter) AllowTx(ctx context.Context, tx DB, key string) (Decision, error) {
	return l.decide(ctx, request{op: OpAllowTx, key: key, n: 1, via: callersTx}, l.checkCost(1), func(ctx context.Context) (Decision, error) {
		return l.allowTx(ctx, tx, l.allowQuery(key, 1))
	})
}

func (l *limiter) AllowTxN(ctx context.Context, tx DB, key string, n int) (Decision, error) {
	return l.decide(ctx, request{op: OpAllowTxN, key: key, n: n, via: callersTx}, l.checkCost(n), func(ctx context.Context) (Decision, error) {
		return l.allowTx(ctx, tx, l.allowQuery(key, n))
	})
}

// allowTx decides q in the caller's transaction tx, with the id ctx
// carries if any.
func (l *limiter) allowTx(ctx context.Context, tx DB, q query) (Decision, error) {
	if id, ok := IDFrom(ctx); ok {
		return l.decideID(ctx, tx, q, id)
	}
	return l.runTx(ctx, tx, q)
}

func (l *limiter) AllowAtMost(ctx context.Context, key string, n int) (Decision, error) {
	var invalid error
	if n <= 0 {
		invalid = fmt.Errorf("%w: n must be positive, got %d", ErrInvalidCost, n)
	}
	return l.decide(ctx, request{op: OpAllowAtMost, key: key, n: n, via: preblocked}, invalid, func(ctx context.Context) (Decision, error) {
		if l.plain.General == nil { // Range: a cooldown grants one unit at a time
			return l.run(ctx, l.allowQuery(key, 1))
		}
		return l.runID(ctx, l.generalQuery(key, n, modeAtMost, 0))
	})
}

func (l *limiter) Reserve(ctx context.Context, key string, n int, maxDelay time.Duration) (Decision, error) {
	return l.decide(ctx, request{op: OpReserve, key: key, n: n, via: direct}, l.checkReserve(n, maxDelay), func(ctx context.Context) (Decision, error) {
		return l.runID(ctx, l.generalQuery(key, n, modeReserve, maxDelay))
	})
}

// runID runs q in its own transaction, with the id ctx carries if any.
func (l *limiter) runID(ctx context.Context, q query) (Decision, error) {
	if id, ok := IDFrom(ctx); ok {
		return l.decideID(ctx, nil, q, id)
	}
	return l.run(ctx, q)
}

// checkReserve validates Reserve's arguments: a strategy that reserves
// (not Range), GCRA limits only, a maximum delay that is not negative, and
// n units that could fit within it.
func (l *limiter) checkReserve(n int, maxDelay time.Duration) error {
	// The strategy before the arguments, the limits after.
	if err := engine.Check(engine.Reserve, engine.Shape{Strategy: l.caps.Strategy}); err != nil {
		return err
	}
	if maxDelay < 0 {
		return fmt.Errorf("%w: maxDelay must not be negative, got %s", ErrInvalidCost, maxDelay)
	}
	if n <= 0 {
		return fmt.Errorf("%w: n must be positive, got %d", ErrInvalidCost, n)
	}
	if err := engine.Check(engine.Reserve, l.shape(engine.Unchecked)); err != nil {
		return err
	}
	if l.cfg.Overrides {
		return nil // the key's own limits decide what fits (scanGeneral)
	}
	return costFits(l.cfg.Limits, n, modeReserve, maxDelay.Microseconds())
}

func (l *limiter) Peek(ctx context.Context, key string, n int) (Decision, error) {
	return l.decide(ctx, request{op: OpPeek, key: key, n: n, via: preblocked}, l.checkCost(n), func(ctx context.Context) (Decision, error) {
		if err := l.check(ctx, l.db); err != nil {
			return Decision{}, err
		}
		if l.plain.General == nil {
			return l.peekRange(ctx, key, n)
		}
		row := l.db.QueryRow(ctx, l.stmts().Peek, l.args.namespace, key)
		d, _, err := l.scanGeneral(row, n, modeAllow, 0, nil)
		return d, err
	})
}

// peekRange is Peek for Range, whose live cooldown is its TAT.
func (l *limiter) peekRange(ctx context.Context, key string, n int) (Decision, error) {
	var tat *int64
	var now int64
	if err := l.db.QueryRow(ctx, l.stmts().Peek, l.args.namespace, key).Scan(&tat, &now); err != nil {
		return Decision{}, err
	}
	if tat == nil || *tat <= now+l.burstT-int64(n)*l.emission {
		d := l.gcraDecision(true, max(now, derefOr(tat, now))+int64(n)*l.emission, now, n)
		return d, nil
	}
	return l.gcraDecision(false, *tat, now, n), nil
}

func derefOr(p *int64, or int64) int64 {
	if p == nil {
		return or
	}
	return *p
}

// run decides on the limiter's own db, in the statement's own transaction.
func (l *limiter) run(ctx context.Context, q query) (Decision, error) {
	if err := l.check(ctx, l.db); err != nil {
		return Decision{}, err
	}
	params := l.params(q)
	for range maxAttempts {
		d, decided, err := l.scan(l.db.QueryRow(ctx, l.sql(q, false), params...), q, false)
		switch code := pgtx.Code(err); {
		case code == pgtx.CodeSerializationFailure:
			continue // the statement was its own transaction: run it afresh
		case code != "" && code == l.contended:
			return l.lostRace(), nil
		case err != nil || decided:
			return d, err
		}
	}
	return l.lostRace(), nil
}

// runTx decides in the caller's transaction. The statement runs in a
// savepoint, so that no error of its own (contention, a serialization
// failure at the caller's isolation level, a lock wait past Timeout) aborts
// the transaction. The wait is bounded on the server by lock_timeout, set
// for the savepoint and restored after it: a client-side deadline would
// make pgx close the caller's connection.
func (l *limiter) runTx(ctx context.Context, tx DB, q query) (Decision, error) {
	if err := l.check(ctx, tx); err != nil {
		return Decision{}, err
	}
	for range maxAttempts {
		d, decided, err := l.runInSavepoint(ctx, tx, q)
		switch code := pgtx.Code(err); {
		case err == nil && !decided:
			continue // in READ COMMITTED the next statement has a fresh snapshot
		case code != "" && code == l.contended:
			return l.lostRace(), nil
		case pgtx.ServerTimeout(err):
			return Decision{}, fmt.Errorf("%w (%s, lock_timeout and statement_timeout %s): %w", ErrTimeout, l.cfg.Strategy, l.cfg.Timeout, err)
		case code == pgtx.CodeSerializationFailure:
			// At REPEATABLE READ or above, a concurrent decision changed
			// the key after the caller's snapshot: it won the race.
			return l.lostRace(), nil
		default:
			return d, err
		}
	}
	return l.lostRace(), nil
}

// runInSavepoint runs q in a savepoint of tx: see pgtx.InSavepoint.
func (l *limiter) runInSavepoint(ctx context.Context, tx DB, q query) (d Decision, decided bool, err error) {
	err = pgtx.InSavepoint(ctx, tx, l.cfg.Timeout, l.sql(q, true), l.params(q), func(row pgx.Row) error {
		d, decided, err = l.scan(row, q, true)
		return err
	})
	return d, decided, err
}

// check finds out whether the table is distributed, and runs verify,
// until both have passed once.
func (l *limiter) check(ctx context.Context, db DB) error {
	if l.verified.Load() {
		return nil
	}
	if err := l.checkTable(ctx, db); err != nil {
		return err
	}
	dep, err := l.detectDistributed(ctx, db)
	if err != nil {
		return err
	}
	if err := engine.Check(engine.Open, l.shape(dep)); err != nil {
		return err
	}
	if zones := calendarZones(l.cfg.Limits); len(zones) > 0 {
		// On the limiter's own db: an error in the caller's transaction
		// would abort it.
		if _, err := l.db.Exec(ctx, zonesKnownSQL, zones); err != nil {
			return unknownZone(l.cfg.Limits, err)
		}
	}
	if l.verify != nil {
		if err := l.verify(ctx, db); err != nil {
			return err
		}
	}
	l.verified.Store(true)
	return nil
}

func (l *limiter) Reset(ctx context.Context, key string) error {
	return l.act(ctx, action{op: OpReset, key: key, validKey: true, table: true, what: "reset"}, func(ctx context.Context) error {
		if _, err := l.db.Exec(ctx, l.keySQL.Reset, l.args.namespace, key, l.args.lockClass); err != nil {
			return failed(fmt.Errorf("reset: %w", err))
		}
		l.preblock.Forget(key)
		l.flights.Forget(key)
		l.batch.Forget(key)
		return nil
	})
}
