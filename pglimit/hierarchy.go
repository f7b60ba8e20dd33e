package pglimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
	"github.com/pglimit/cooldown/pglimit/internal/engine"
	"github.com/pglimit/cooldown/pglimit/internal/fault"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
)

// MaxLevels is the most charges one AllowAll decides at once; it needs
// at least one.
const MaxLevels = 8

// Charge is one level of a hierarchical decision: Key under Limiter, such
// as an organisation under its limiter, a user of it under another, and an
// API key under a third.
type Charge struct {
	Limiter Limiter
	Key     string
}

// Decisions is the outcome of [AllowAll].
type Decisions struct {
	// Allowed reports whether every level admitted the request, and so
	// was charged; when it is false none was.
	Allowed bool
	// RetryAfter is, for a refusal, the longest wait of the levels that
	// refused it: when the request may pass at every level.
	RetryAfter time.Duration
	// Levels are the levels' decisions, in the order of the charges. A
	// refusing level's is a refusal with its own RetryAfter and limit;
	// a level that would have admitted, in a refused request, reports
	// Allowed with Granted 0: it was charged nothing.
	Levels []Decision
}

// Refused returns the indexes, in the charges, of the levels that refused.
func (d Decisions) Refused() []int {
	var out []int
	for i, l := range d.Levels {
		if !l.Allowed {
			out = append(out, i)
		}
	}
	return out
}

// AllowAll admits a request of cost n only if every level of charges
// admits it, and then charges n units to every level.
//
// Otherwise it charges none. One statement decides, so no instance can slip
// between the levels, and the levels are locked in one global order whatever
// order the charges come in, so concurrent calls never deadlock. A refusal
// names the levels that refused, each with its RetryAfter (docs/limits.md,
// "Several keys at once"); like a single key's, it is decided on the
// statement's snapshot, with no lock and no write.
//
// charges must hold 1 to [MaxLevels] levels. Each Limiter must come from
// [New] (its [Config.Observer] does not see the call), with the Upsert or
// NoWait strategy, and all must share one pool, the same [DB] handle, as
// one statement on one connection decides every level: two pools, even of
// one database, are refused. No two charges may name one key of one
// limiter. Each of these is [ErrInvalidConfig], but for Range, which is
// [ErrUnsupported]. A limiter in shadow mode is charged when it admits and
// never refuses the request. n must fit every level's limits
// ([ErrInvalidCost]). An admitted level's decision can be refunded with
// its limiter's Refund.
//
// With a decision id ([WithID]), the admission stores the id at every
// level, in its limiter's namespace: a retry replays every level's first
// decision and charges none, and each level is refunded or settled by the
// id at its own limiter ([RefundID], [SettleID]). An id that another
// decision holds at any level is [ErrInvalidID] and changes nothing.
func AllowAll(ctx context.Context, n int, charges ...Charge) (Decisions, error) {
	return allowAll(ctx, nil, n, charges)
}

// AllowAllTx is AllowAll inside the caller's transaction tx: the units
// count only if tx commits. Like [Limiter.AllowTxN], the statement runs
// in a savepoint, so that a lost race (at any isolation level) is a
// refusal and a wait past the first level's Timeout is [ErrTimeout],
// and tx stays usable either way; an admitted level's Refund gives back
// only what tx committed. A refusal on tx's snapshot takes no lock.
func AllowAllTx(ctx context.Context, tx DB, n int, charges ...Charge) (Decisions, error) {
	if tx == nil {
		return Decisions{}, fmt.Errorf("%w: AllowAllTx: tx is nil", ErrInvalidConfig)
	}
	return allowAll(ctx, tx, n, charges)
}

// allowAll is AllowAll, in tx when it is not nil, each level seen by its
// limiter's Observer.
func allowAll(ctx context.Context, tx DB, n int, charges []Charge) (Decisions, error) {
	type seen struct {
		obs   Observer
		ctx   context.Context
		o     Observation
		level int // in the charges
	}
	lims := make([]*limiter, len(charges))
	for i, c := range charges {
		l, ok := c.Limiter.(*limiter)
		if !ok { // not every level is a limiter: none is seen
			return allowAllUnobserved(ctx, tx, n, charges)
		}
		lims[i] = l
	}
	var observed []seen
	id, _ := IDFrom(ctx)
	for i, l := range lims {
		if obs := l.observers.decisions; obs != nil {
			o := Observation{Op: OpAllowAll, Namespace: l.cfg.Namespace, Strategy: l.cfg.Strategy, Key: charges[i].Key, ID: id, N: n}
			observed = append(observed, seen{obs, obs.StartDecision(ctx, o), o, i})
		}
	}
	begin := time.Now()
	ds, err := allowAllUnobserved(ctx, tx, n, charges)
	took := time.Since(begin)
	for _, s := range observed {
		s.o.Err, s.o.Took = err, took
		if err == nil {
			s.o.Decision = ds.Levels[s.level]
		}
		s.obs.EndDecision(s.ctx, s.o)
	}
	return ds, err
}

// allowAllUnobserved is allowAll unobserved.
func allowAllUnobserved(ctx context.Context, tx DB, n int, charges []Charge) (Decisions, error) {
	levels, err := hierarchyLevels(charges, n)
	if err != nil {
		return Decisions{}, err
	}
	id, hasID := IDFrom(ctx)
	if hasID {
		if err := idLevels(levels, id); err != nil {
			return Decisions{}, err
		}
	}
	first := levels[0].l
	sql := hierarchyStatements.get(levels, tx != nil, hasID)
	args := make([]any, 0, 2*len(levels)+2)
	for _, lv := range levels {
		args = append(args, lv.l.cfg.Namespace, lv.key)
	}
	args = append(args, int64(n))
	if hasID {
		args = append(args, id)
	}
	db := first.db
	if tx != nil {
		db = tx
	}
	ctx, cancel := withDeadline(ctx, first.cfg.Timeout, tx != nil) // in tx the server bounds the waits: lock_timeout
	defer cancel()
	for _, lv := range levels {
		// A level's first statement, its table's check, is bounded and
		// failed as the decision's: ErrTimeout, ErrUnavailable.
		if err := lv.l.check(ctx, first.db); err != nil {
			return Decisions{}, fault.Wrap(ctx, "AllowAll", first.cfg.Timeout, err)
		}
		if err := engine.Check(engine.AllowAll, lv.shape(lv.l.deployment(), hasID)); err != nil {
			return Decisions{}, err
		}
	}
	// run runs sql with args, on the limiters' db or in a savepoint of tx.
	run := func(sql string, args []any, scan func(pgx.Row) error) error {
		if tx == nil {
			return scan(first.db.QueryRow(ctx, sql, args...))
		}
		return pgtx.InSavepoint(ctx, tx, first.cfg.Timeout, sql, args, scan)
	}
	// refused is out, unless a concurrent decision took the id meanwhile:
	// then that one.
	refused := func(out Decisions) (Decisions, error) {
		if !hasID {
			return out, nil
		}
		if first, found, err := replayAll(ctx, db, levels, id); err != nil || found {
			return first, err
		}
		return out, nil
	}
	for range maxAttempts {
		out, missing, taken, err := runHierarchy(run, sql, args, levels, n, tx != nil, hasID)
		switch code := pgtx.Code(err); {
		case tx != nil && pgtx.ServerTimeout(err):
			return Decisions{}, fmt.Errorf("%w (AllowAllTx, lock_timeout and statement_timeout %s): %w", ErrTimeout, first.cfg.Timeout, err)
		case tx != nil && code == pgtx.CodeSerializationFailure:
			// At REPEATABLE READ or above, a concurrent decision changed
			// a level's row after the caller's snapshot: it won the race.
			return refused(lostRaces(levels))
		case hasID && code == pgtx.CodeUniqueViolation:
			// A level's claim, which has no ON CONFLICT: the id names
			// another decision in that level's namespace.
			return Decisions{}, fmt.Errorf("%w: AllowAll: the id %q names another decision in a level's namespace", ErrInvalidID, id)
		case err != nil:
			return Decisions{}, fault.Wrap(ctx, "AllowAll", first.cfg.Timeout, err)
		case taken:
			if first, found, err := replayAll(ctx, db, levels, id); err != nil || found {
				return first, err
			}
			continue // its rows were deleted since (the cleanup job): decide afresh
		case len(missing) == 0 && !out.Allowed:
			return refused(out)
		case len(missing) == 0:
			return out, nil
		}
		// A key with no row yet: a blank row means the same as none, and
		// gives the statement a row to lock.
		for _, lv := range missing {
			err := run(lv.l.keySQL.Blank, []any{lv.l.cfg.Namespace, lv.key}, func(row pgx.Row) error {
				if err := row.Scan(new(int)); err != nil && !errors.Is(err, pgx.ErrNoRows) {
					return err
				}
				return nil
			})
			if err != nil {
				return Decisions{}, fault.Wrap(ctx, "AllowAll", first.cfg.Timeout, err)
			}
		}
	}
	// The keys kept changing: contention is a refusal.
	return refused(lostRaces(levels))
}

// idLevels checks that every level of an AllowAll with the decision id id
// takes ids, and id.
func idLevels(levels []level, id string) error {
	for _, lv := range levels {
		if err := engine.Check(engine.AllowAll, lv.shape(engine.Unchecked, true)); err != nil {
			return err
		}
	}
	return ValidateID(id)
}

// replayAll is the first decision of the AllowAll whose id is id, rebuilt
// from its levels' rows, and whether it has one: the first level's row in
// lock order claims the id. A level whose row is missing, or names
// another key, means the id names another decision.
func replayAll(ctx context.Context, db DB, levels []level, id string) (Decisions, bool, error) {
	out := Decisions{Allowed: true, Levels: make([]Decision, len(levels))}
	for i, lv := range levels {
		row, found, err := lv.l.lookupID(ctx, db, id)
		switch {
		case err != nil:
			return Decisions{}, false, fault.Wrap(ctx, "AllowAll", lv.l.cfg.Timeout, err)
		case !found && i == 0:
			return Decisions{}, false, nil
		case !found || row.key != lv.key:
			return Decisions{}, false, fmt.Errorf("%w: AllowAll: the id %q names another decision of charges[%d]'s limiter", ErrInvalidID, id, lv.index)
		}
		out.Levels[lv.index] = row.d
	}
	return out, true, nil
}

// lostRaces is the refusal of a request that lost a race at every level.
func lostRaces(levels []level) Decisions {
	out := Decisions{Levels: make([]Decision, len(levels))}
	for _, lv := range levels {
		out.Levels[lv.index] = lv.l.lostRace()
		out.RetryAfter = max(out.RetryAfter, lv.l.worst)
	}
	return out
}

// level is a charge as the statement decides it.
type level struct {
	l     *limiter
	key   string
	index int // in the charges
}

// shape is what the capability table reads of the level, on a table
// the database made dep, in an AllowAll with an id or without.
func (lv level) shape(dep engine.Deployment, id bool) engine.Shape {
	s := lv.l.shape(dep)
	s.ID, s.Level = id, lv.index
	return s
}

// hierarchyLevels checks charges and returns them in the global lock
// order: table, namespace, key.
func hierarchyLevels(charges []Charge, n int) ([]level, error) {
	if len(charges) == 0 || len(charges) > MaxLevels {
		return nil, fmt.Errorf("%w: AllowAll: %d charges, not in [1, %d]", ErrInvalidConfig, len(charges), MaxLevels)
	}
	if n <= 0 {
		return nil, fmt.Errorf("%w: AllowAll: n must be positive, got %d", ErrInvalidCost, n)
	}
	levels := make([]level, len(charges))
	for i, c := range charges {
		l, ok := c.Limiter.(*limiter)
		if !ok {
			return nil, fmt.Errorf("%w: AllowAll: charges[%d]: a Limiter that pglimit.New did not make", ErrInvalidConfig, i)
		}
		if err := engine.Check(engine.AllowAll, level{l: l, index: i}.shape(engine.Unchecked, false)); err != nil {
			return nil, err
		}
		if i > 0 && !sameDB(l.db, levels[0].l.db) {
			return nil, fmt.Errorf("%w: AllowAll: charges[%d]'s limiter is on another DB than charges[0]'s: give them one pool", ErrInvalidConfig, i)
		}
		if err := ValidateKey(c.Key); err != nil {
			return nil, fmt.Errorf("AllowAll: charges[%d]: %w", i, err)
		}
		if !l.cfg.Overrides {
			if err := costFits(l.cfg.Limits, n, modeAllow, 0); err != nil {
				return nil, fmt.Errorf("AllowAll: charges[%d]: %w", i, err)
			}
		}
		levels[i] = level{l: l, key: c.Key, index: i}
	}
	slices.SortFunc(levels, func(a, b level) int {
		return cmp.Or(strings.Compare(a.l.table, b.l.table), strings.Compare(a.l.cfg.Namespace, b.l.cfg.Namespace), strings.Compare(a.key, b.key))
	})
	for i := 1; i < len(levels); i++ {
		a, b := levels[i-1], levels[i]
		if a.l.table == b.l.table && a.l.cfg.Namespace == b.l.cfg.Namespace && a.key == b.key {
			return nil, fmt.Errorf("%w: AllowAll: charges[%d] and charges[%d] name one key %q of one namespace %q", ErrInvalidConfig, min(a.index, b.index), max(a.index, b.index), a.key, a.l.cfg.Namespace)
		}
	}
	return levels, nil
}

// sameDB reports whether a and b are the same handle (a pool, a
// connection); handles that cannot be compared are not.
func sameDB(a, b DB) bool {
	t := reflect.TypeOf(a)
	return t == reflect.TypeOf(b) && t.Comparable() && a == b
}

// hierarchyStatements keeps the statements of the sets of limiters that
// AllowAll decided lately, as a limiter keeps its own: writing one takes
// longer than running it.
var hierarchyStatements = statementCache{m: map[statementKey]string{}}

// statementCache maps limiters, in lock order, to their statement. It is
// bounded: when full it starts afresh, so that limiters an application
// dropped are not kept alive by it.
type statementCache struct {
	mu sync.Mutex
	m  map[statementKey]string
}

// statementKey names a statement: its limiters, whether it runs in a
// caller's transaction, and whether it claims a decision id.
type statementKey struct {
	limiters [MaxLevels]*limiter
	inTx, id bool
}

// maxCachedStatements bounds statementCache.
const maxCachedStatements = 64

func (c *statementCache) get(levels []level, inTx, id bool) string {
	k := statementKey{inTx: inTx, id: id}
	for i, lv := range levels {
		k.limiters[i] = lv.l
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	sql, ok := c.m[k]
	if !ok {
		if len(c.m) >= maxCachedStatements {
			clear(c.m)
		}
		sql = hierarchySQL(levels, inTx, id)
		c.m[k] = sql
	}
	return sql
}

// hierarchySQL is the statement for levels' limiters (in lock order), in
// a caller's transaction or its own, with a decision id or without
// (internal/engine writes it).
func hierarchySQL(levels []level, inTx, id bool) string {
	specs := make([]engine.Spec, len(levels))
	for i, lv := range levels {
		specs[i] = specOf(lv.l.cfg)
	}
	return engine.Hierarchy(specs, inTx, id)
}

// runHierarchy runs the statement once and reads its answer: the decisions
// (in the charges' order), or the levels whose key has no row yet, or with
// a decision id (id), that another decision took it.
func runHierarchy(run func(string, []any, func(pgx.Row) error) error, sql string, args []any, levels []level, n int, inTx, id bool) (_ Decisions, missing []level, taken bool, _ error) {
	type row struct {
		found         int64
		state         []int64
		tat           *int64
		rates, bursts []int64
		unknown       []string
	}
	var (
		locked   bool
		admitted bool
		now      int64
		setting  *string
		written  int64
		rows     = make([]row, len(levels))
	)
	dest := []any{&locked, &admitted, &now, &setting, &written}
	if id {
		dest = append(dest, &taken)
	}
	for i, lv := range levels {
		dest = append(dest, &rows[i].found, &rows[i].state, &rows[i].tat)
		if lv.l.cfg.Overrides {
			dest = append(dest, &rows[i].rates, &rows[i].bursts, &rows[i].unknown)
		}
	}
	if err := run(sql, args, func(row pgx.Row) error { return row.Scan(dest...) }); err != nil {
		return Decisions{}, nil, false, unknownZone(levels[0].l.cfg.Limits, err)
	}
	// Unlocked, the rows are the snapshot's, on which a level refused: a
	// key without a row stands as a new one.
	for i, lv := range levels {
		if locked && rows[i].found == 0 {
			missing = append(missing, lv)
		}
	}
	if len(missing) > 0 || taken {
		return Decisions{}, missing, taken, nil
	}
	out := Decisions{Allowed: admitted, Levels: make([]Decision, len(levels))}
	wrote := int64(0)
	for i, lv := range levels {
		l, r := lv.l, rows[i]
		limits, policy := l.cfg.Limits, l.policy
		if l.cfg.Overrides {
			var err error
			if limits, policy, err = l.ownLimits(r.rates, r.bursts, r.unknown, n, modeAllow, 0); err != nil {
				return Decisions{}, nil, false, fmt.Errorf("key %q: %w", lv.key, err)
			}
		}
		e := arith.Evaluate(specs(limits), r.state, r.tat, now, int64(n), arith.Allow, 0)
		d := evaluated(e, limits, policy, now, n, modeAllow)
		switch {
		case admitted && e.Allowed:
			wrote++
			if !id { // with an id, its rows are the tickets (RefundID)
				d = l.withTicket(d, lv.key, limits, e.Anchors)
				if inTx {
					d.refund.xact = setting
				}
			}
		case admitted: // a level in shadow mode that would have refused
			d = d.shadowed(n)
		case e.Allowed: // charged nothing: another level refused
			d.Granted, d.Remaining = 0, int(e.Remaining)+n
		case l.cfg.Shadow: // it would have refused, but never does
			d = d.shadowed(n)
		default:
			out.RetryAfter = max(out.RetryAfter, d.RetryAfter)
		}
		out.Levels[lv.index] = d
	}
	if written != wrote || !admitted && len(out.Refused()) == 0 {
		return Decisions{}, nil, false, fmt.Errorf("the database's decision (admitted %t, %d rows written) differs from the library's on the same rows (%d levels admitting): a bug; please report it", admitted, written, wrote)
	}
	return out, nil, false, nil
}
