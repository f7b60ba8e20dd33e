package pglimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
	"github.com/pglimit/cooldown/pglimit/internal/engine"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
)

// MaxIDLength is the longest decision id ([WithID]), in bytes: an
// idempotency key, a job or request id, a UUID or a hash fits.
const MaxIDLength = 255

// The bounds and default of [Config.IDRetention].
const (
	DefaultIDRetention = 24 * time.Hour
	MinIDRetention     = time.Minute
	MaxIDRetention     = 30 * 24 * time.Hour
)

// idModeAll is the mode of an id's row that a level of AllowAll stored:
// the general statement's state, decided as Allow's (hierarchy.claim).
const idModeAll = 3

type idContextKey struct{}

// WithID returns a copy of ctx that gives the decision made with it the id
// id: an idempotency key, a job id, a request id. A decision with an id
// that admits is charged once in its limiter's namespace, whatever
// happens after: a retry with the same id, on any instance, while the id
// is kept (Config.IDRetention, until the cleanup job deletes it) charges
// nothing and returns the first admission, with [Decision.Replayed] set.
// An id first refused is decided afresh; an id admitted by AllowTx in a
// transaction that rolled back was never admitted. docs/limits.md,
// "Decision ids", defines them. An admission with an id is refunded or
// settled by its id ([RefundID], [SettleID]), from any instance, at most
// once; its Decision value cannot be refunded or settled.
//
// Allow, AllowN, AllowTx, AllowTxN, AllowAtMost and Reserve (and so
// [Wait], [WaitN] and [WaitAtMost]) of an Upsert or NoWait limiter without
// Overrides read the id; Peek and Reset ignore it. A replayed
// reservation's Delay is what is left of the first one's, and a Wait with
// an id whose ctx ends keeps its reservation for the retry. [AllowAll]
// and [AllowAllTx] store the id at every level, each refunded or settled
// by it at its own limiter. A table Citus distributes, and a level in
// shadow mode, take no ids yet ([ErrUnsupported]). An id that is empty, longer
// than [MaxIDLength], not valid UTF-8 or that contains a NUL byte makes
// the call fail with [ErrInvalidID] and write nothing.
func WithID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, idContextKey{}, id)
}

// IDFrom returns the decision id ctx carries ([WithID]), if any.
func IDFrom(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(idContextKey{}).(string)
	return id, ok
}

// ValidateID returns an error wrapping [ErrInvalidID] if id is not a
// valid decision id.
//
// An id is invalid when empty, longer than [MaxIDLength] bytes, not valid
// UTF-8, or with a NUL byte (which PostgreSQL text cannot hold).
func ValidateID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrInvalidID)
	case len(id) > MaxIDLength:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidID, len(id), MaxIDLength)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidID)
	case strings.IndexByte(id, 0) >= 0:
		return fmt.Errorf("%w: contains a NUL byte", ErrInvalidID)
	}
	return nil
}

// checkID reports whether a call of op, a decision method, may carry an
// id, when ctx has one, and whether the id is valid. Peek ignores an id.
func (l *limiter) checkID(ctx context.Context, op Op) (hasID bool, err error) {
	id, ok := IDFrom(ctx)
	if !ok || op == OpPeek {
		return false, nil
	}
	s := l.shape(engine.Unchecked)
	s.ID = true
	if err := engine.Check(engine.Op(op), s); err != nil {
		return true, err
	}
	return true, ValidateID(id)
}

// takenRow is an id statement's row: the first column, whether the id was
// taken, goes to taken, the rest to the id-less statement's scan.
type takenRow struct {
	row   pgx.Row
	taken *bool
}

func (r takenRow) Scan(dest ...any) error {
	return r.row.Scan(append([]any{r.taken}, dest...)...)
}

// decideID decides q with the id id: in tx, a caller's transaction, or in
// the statement's own on the limiter's db when tx is nil. An admission
// claims the id in its own statement; an id that another decision took
// returns that decision (replay), and so does a refusal of an id another
// decision took meanwhile.
func (l *limiter) decideID(ctx context.Context, tx DB, q query, id string) (Decision, error) {
	inTx := tx != nil
	db := l.db
	if inTx {
		db = tx
	}
	if err := l.check(ctx, db); err != nil {
		return Decision{}, err
	}
	// An id's rows are one for every decision method (Allow's); the
	// method's own passed before.
	s := l.shape(l.deployment())
	s.ID = true
	if err := engine.Check(engine.Allow, s); err != nil {
		return Decision{}, err
	}
	sql, params := l.idQuery(q, id, inTx)
	for range maxAttempts {
		var taken, decided bool
		var d Decision
		scan := func(row pgx.Row) (err error) {
			d, decided, err = l.scan(takenRow{row, &taken}, q, inTx)
			return err
		}
		var err error
		if inTx {
			err = pgtx.InSavepoint(ctx, tx, l.cfg.Timeout, sql, params, scan)
		} else {
			err = scan(l.db.QueryRow(ctx, sql, params...))
		}
		switch code := pgtx.Code(err); {
		case err == nil && taken:
			if first, found, err := l.replay(ctx, db, id); err != nil || found {
				return first, err
			}
			// The id's row was deleted since (the cleanup job): decide
			// afresh.
		case err == nil && decided && d.Allowed:
			// Its ticket is its id's row (RefundID): a ticket in the value
			// too would let both give the units back.
			d.refund = nil
			return d, nil
		case err == nil && decided:
			return l.refusedID(ctx, db, id, d)
		case err == nil:
			// Undecided: the key changed after the snapshot.
		case code == pgtx.CodeUniqueViolation:
			// A concurrent first decision of the key committed after the
			// snapshot; the statement, its id's row with it, was undone.
		case code == pgtx.CodeSerializationFailure && !inTx:
			// Its own transaction: run it afresh.
		case code != "" && code == l.contended, code == pgtx.CodeSerializationFailure:
			return l.refusedID(ctx, db, id, l.lostRace())
		case inTx && pgtx.ServerTimeout(err):
			return Decision{}, fmt.Errorf("%w (%s, lock_timeout and statement_timeout %s): %w", ErrTimeout, l.cfg.Strategy, l.cfg.Timeout, err)
		default:
			return Decision{}, err
		}
	}
	return l.refusedID(ctx, db, id, l.lostRace())
}

// idQuery is q's id statement and its parameters.
func (l *limiter) idQuery(q query, id string, inTx bool) (string, []any) {
	params := l.params(q)
	if q.general {
		if inTx {
			return l.ids.GeneralTx[q.mode], append(params, id, l.args.idRetention)
		}
		return l.ids.General[q.mode], append(params, id, l.args.idRetention)
	}
	params = append(params, id, q.n, l.args.idRetention)
	if inTx {
		return l.ids.FastTx, params
	}
	return l.ids.Fast, params
}

// refusedID is refusal, a refusal of the id id, unless a concurrent
// decision has admitted the id meanwhile: then that one.
func (l *limiter) refusedID(ctx context.Context, db DB, id string, refusal Decision) (Decision, error) {
	first, found, err := l.replay(ctx, db, id)
	if err != nil || found {
		return first, err
	}
	return refusal, nil
}

// idRow is an id's row: its first decision, rebuilt as its statement
// answered, that decision's key and the units it took, the anchors a
// refund of it checks, and done, set once it was refunded or settled by
// id.
type idRow struct {
	d       Decision
	key     string
	n       int
	anchors []int64
	done    *string
}

// lookupID reads the row of id, if any. A reservation's Delay is what is
// left of it at the lookup.
func (l *limiter) lookupID(ctx context.Context, db DB, id string) (idRow, bool, error) {
	var r struct {
		state      []int64
		tat        *int64
		now, clock int64
		mode       int16
	}
	var row idRow
	err := db.QueryRow(ctx, l.ids.Lookup, l.args.namespace, id).Scan(&r.state, &r.tat, &r.now, &row.key, &row.n, &row.done, &r.mode, &r.clock)
	if errors.Is(err, pgx.ErrNoRows) {
		return idRow{}, false, nil
	}
	if err != nil {
		return idRow{}, false, fmt.Errorf("look up decision id: %w", err)
	}
	mode := int(r.mode)
	if l.single && mode == modeAllow { // the fast statement's
		row.d, row.anchors = l.gcraDecision(true, *r.tat, r.now, row.n), []int64{*r.tat}
	} else {
		if mode == idModeAll {
			mode = modeAllow
		}
		var maxDelay int64
		if mode == modeReserve { // it was admitted: within any maximum
			maxDelay = maxPeriod.Microseconds()
		}
		e := arith.Evaluate(l.specs, r.state, r.tat, r.now, int64(row.n), arith.Mode(mode), maxDelay)
		row.d, row.anchors = evaluated(e, l.cfg.Limits, l.policy, r.now, row.n, mode), e.Anchors
		row.n = int(e.Granted)
		row.d.Delay = max(row.d.Delay-micros(r.clock-r.now), 0)
	}
	row.d.Replayed = true
	return row, true, nil
}

// replay is the first decision of id, rebuilt from its row, and whether
// the id has one. A replayed decision charged nothing: it has no refund
// ticket.
func (l *limiter) replay(ctx context.Context, db DB, id string) (Decision, bool, error) {
	row, found, err := l.lookupID(ctx, db, id)
	return row.d, found, err
}

// RefundID is [Limiter.Refund] of the admission whose decision id
// ([WithID]) is id, from any instance with the same limiter config, at
// most once.
//
// The id's row in the database is the refund's ticket, not a Decision
// value: a process that did not make the decision may refund it. It gives
// back n of the units the admission took, once: a second RefundID of the
// id, here or on another instance, even racing the first, gives back
// nothing and is [ErrAlreadySettled]. Each limit takes the units back as
// Refund's do (only while the admission still weighs on it as it left
// it), and the result is Refund's. An id with no admission stored (never
// admitted, refused, rolled back, or deleted after its retention) is
// [ErrNotAdmitted]; n not positive or more than the admission took,
// [ErrInvalidCost]; an invalid id, [ErrInvalidID]; where decisions take
// no ids, [ErrUnsupported]. A RefundID whose outcome is unknown may have
// refunded: a retry of it then reports ErrAlreadySettled.
func RefundID(ctx context.Context, lim Limiter, id string, n int) (ok bool, err error) {
	l, err := made(lim, "RefundID")
	if err != nil {
		return false, err
	}
	var invalid error
	if n <= 0 {
		invalid = fmt.Errorf("%w: RefundID: n must be positive, got %d", ErrInvalidCost, n)
	}
	a := action{op: OpRefundID, id: id, n: n, invalid: cmp.Or(invalid, ValidateID(id)), table: true, what: "refund by id"}
	err = l.act(ctx, a, func(ctx context.Context) (err error) {
		ok, err = l.refundID(ctx, id, n)
		return err
	})
	return ok, err
}

// refundID is RefundID past the door.
func (l *limiter) refundID(ctx context.Context, id string, n int) (bool, error) {
	row, found, err := l.lookupID(ctx, l.db, id)
	switch {
	case err != nil:
		return false, failed(err)
	case !found:
		return false, fmt.Errorf("%w: RefundID: no admission has the id %q", ErrNotAdmitted, id)
	case row.done != nil:
		return false, fmt.Errorf("%w: RefundID: the admission of id %q was %s", ErrAlreadySettled, id, *row.done)
	case n > row.n:
		return false, fmt.Errorf("%w: RefundID: %d units, but the admission of id %q took %d", ErrInvalidCost, n, id, row.n)
	}
	emissions := make([]int64, len(l.cfg.Limits))
	for i, lim := range l.cfg.Limits {
		emissions[i] = lim.emission()
	}
	sql, args := l.ids.RefundGeneral, []any{l.args.namespace, row.key, row.anchors, int64(n), emissions, id}
	if l.single {
		sql, args = l.ids.RefundSingle, []any{l.args.namespace, row.key, row.anchors[0], int64(n) * emissions[0], id}
	}
	var made *string
	var took []bool
	err = l.db.QueryRow(ctx, sql, args...).Scan(&made, &took)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, fmt.Errorf("%w: RefundID: the admission of id %q was refunded by another call", ErrAlreadySettled, id)
	case err != nil:
		return false, failed(fmt.Errorf("refund by id: %w", err))
	}
	all := took != nil
	for _, ok := range took {
		all = all && ok
	}
	if all {
		l.preblock.Forget(row.key)
	}
	return all, nil
}

// SettleID is [Settle] of the admission whose decision id ([WithID]) is
// id, from any instance with the same limiter config, at most once.
//
// The id's row is the ticket, as for [RefundID]: it settles the
// admission's units (its estimate) at cost, once; a second SettleID or a
// RefundID of the id, here or on another instance, even racing the first,
// does nothing and is [ErrAlreadySettled], as is a SettleID after a
// RefundID. The Settlement is Settle's. An id with no admission stored is
// [ErrNotAdmitted]; a cost out of Settle's bounds, [ErrInvalidCost]; an
// invalid id, [ErrInvalidID]; where decisions take no ids,
// [ErrUnsupported]. A SettleID whose outcome is unknown may have settled:
// a retry of it then reports ErrAlreadySettled.
func SettleID(ctx context.Context, lim Limiter, id string, cost int) (out Settlement, err error) {
	l, err := made(lim, "SettleID")
	if err != nil {
		return Settlement{}, err
	}
	var invalid error
	if cost < 0 || cost > maxSettleCost {
		invalid = fmt.Errorf("%w: SettleID: cost must be in [0, %d], got %d", ErrInvalidCost, maxSettleCost, cost)
	}
	a := action{op: OpSettleID, id: id, n: cost, invalid: cmp.Or(invalid, ValidateID(id)), table: true, what: "settle by id"}
	err = l.act(ctx, a, func(ctx context.Context) (err error) {
		out, err = l.settleID(ctx, id, cost)
		return err
	})
	return out, err
}

// settleID is SettleID past the door.
func (l *limiter) settleID(ctx context.Context, id string, cost int) (Settlement, error) {
	rates, ts, bts := make([]int64, len(l.cfg.Limits)), make([]int64, len(l.cfg.Limits)), make([]int64, len(l.cfg.Limits))
	for i, lim := range l.cfg.Limits {
		_, rates[i], ts[i], bts[i] = lim.micros()
	}
	for range 2 {
		row, found, err := l.lookupID(ctx, l.db, id)
		switch {
		case err != nil:
			return Settlement{}, failed(err)
		case !found:
			return Settlement{}, fmt.Errorf("%w: SettleID: no admission has the id %q", ErrNotAdmitted, id)
		case row.done != nil:
			return Settlement{}, fmt.Errorf("%w: SettleID: the admission of id %q was %s", ErrAlreadySettled, id, *row.done)
		}
		back, charge := int64(max(row.n-cost, 0)), int64(max(cost-row.n, 0))
		t := &refundTicket{owner: l, key: row.key, limits: l.cfg.Limits, granted: row.n, anchors: row.anchors}
		args := []any{l.args.namespace, row.key, slices.Clone(row.anchors), back, charge, id, rates, ts, bts}
		out, err := l.settle(ctx, t, l.ids.Settle, args)
		switch {
		case err == nil:
			if out.Returned > 0 {
				l.preblock.Forget(row.key)
			}
			return out, nil
		case !errors.Is(err, pgx.ErrNoRows):
			return Settlement{}, failed(fmt.Errorf("settle by id: %w", err))
		}
		// The statement marked nothing: another call settled or refunded
		// the id meanwhile (the lookup above tells), or a charge found no
		// row of the key to charge, which a blank one stands for.
		if _, err := l.db.Exec(ctx, l.keySQL.Blank, l.args.namespace, row.key); err != nil {
			return Settlement{}, failed(fmt.Errorf("settle by id: %w", err))
		}
	}
	if row, found, err := l.lookupID(ctx, l.db, id); err == nil && found && row.done != nil {
		return Settlement{}, fmt.Errorf("%w: SettleID: the admission of id %q was %s", ErrAlreadySettled, id, *row.done)
	}
	return Settlement{}, fmt.Errorf("settle by id: the key's row kept disappearing")
}
