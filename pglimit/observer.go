package pglimit

import (
	"context"
	"time"
)

// Observer sees the start and end of every operation on a key of a
// limiter, as pgx's QueryTracer sees queries: it is how metrics and
// tracing plug into a limiter without wrapping it ([Config.Observer]).
// Every [Op] is observed, whatever its outcome, bad input among them: the
// decision methods, Peek, Reset, Refund, [RefundID], [Settle],
// [SettleID], [Pause], [Inspect], [LimitedKeys], [SetKeyLimits],
// [SetKeyLimitsFor], [ListKeyLimits], and each level of [AllowAll] on its
// own limiter's Observer. A call whose Limiter [New] did not make, or an AllowAll whose
// charges are not all such limiters, is not. Its methods run on the
// caller's goroutine, around the operation, and must be safe for
// concurrent use: one Observer may serve many limiters, told apart by each
// observation's Namespace and Strategy.
//
// An Observer may also implement [BatchObserver], [LevelObserver] and
// [LeaseObserver]; New checks for them once.
type Observer interface {
	// StartDecision is called before an operation, with o's Decision,
	// Err and Took unset. The operation runs with the context it returns,
	// so a span it starts is the parent of the operation's own statement
	// (for AllowAll, whose one statement serves every level, the caller's
	// context runs it).
	StartDecision(ctx context.Context, o Observation) context.Context

	// EndDecision is called once the operation has ended, with the
	// context StartDecision returned and o complete.
	EndDecision(ctx context.Context, o Observation)
}

// Op names an operation on a key, as [Observation.Op] reports it.
type Op string

// The operations an [Observer] sees.
const (
	OpAllow       Op = "Allow"
	OpAllowN      Op = "AllowN"
	OpAllowTx     Op = "AllowTx"
	OpAllowTxN    Op = "AllowTxN"
	OpAllowAtMost Op = "AllowAtMost"
	OpReserve     Op = "Reserve"
	OpAllowAll    Op = "AllowAll" // one observation per level, on its limiter
	OpPeek        Op = "Peek"
	OpReset       Op = "Reset"
	OpRefund      Op = "Refund"
	OpRefundID    Op = "RefundID"
	OpSettle      Op = "Settle"
	OpSettleID    Op = "SettleID"
	OpPause       Op = "Pause"

	// Reading and setting keys' state and own limits.
	OpInspect         Op = "Inspect"
	OpLimitedKeys     Op = "LimitedKeys" // no Key; N is n
	OpSetKeyLimits    Op = "SetKeyLimits"
	OpSetKeyLimitsFor Op = "SetKeyLimitsFor"
	OpListKeyLimits   Op = "ListKeyLimits" // no Key
)

// Decides reports whether op admits or refuses units: the decision
// methods and AllowAll, whose outcomes metrics count. Peek consumes
// nothing, and the others give back, settle or reset what was decided.
func (op Op) Decides() bool {
	switch op {
	case OpAllow, OpAllowN, OpAllowTx, OpAllowTxN, OpAllowAtMost, OpReserve, OpAllowAll:
		return true
	}
	return false
}

// Observation is one operation as an [Observer] sees it.
type Observation struct {
	Op Op // the operation called

	Namespace string   // the limiter's, as [Policy] reports it
	Strategy  Strategy // the limiter's
	// Key is the key, as the caller gave it, which may be invalid; for
	// Refund and Settle the refunded decision's ("" for one that took
	// nothing), for RefundID and SettleID "" (ID names the decision).
	Key string
	// ID is the decision id: the one ctx carries ([WithID]), or
	// RefundID's and SettleID's; "" for none.
	ID string
	// N is the units asked for (1 for Allow and AllowTx), given back
	// (Refund, RefundID) or settled at (Settle, SettleID); 0 for Reset
	// and Pause.
	N int

	// Decision is what a decision method, Peek or a level of AllowAll
	// returned; zero for the other operations.
	Decision Decision
	Err      error         // what the operation returned
	Took     time.Duration // from StartDecision's return to the operation's
}

// BatchObserver is an [Observer] that also sees each statement group
// commit sends for many callers' Allow and AllowN at once. The callers'
// decisions are still observed one by one; a batch's statement runs on
// none of their goroutines, under none of their contexts.
type BatchObserver interface {
	// ObserveBatch is called once a batch statement has returned.
	ObserveBatch(ctx context.Context, b BatchObservation)
}

// BatchObservation is one batch statement as a [BatchObserver] sees it.
type BatchObservation struct {
	Namespace string
	Strategy  Strategy
	Keys      []string      // the keys it decided for; the observer's own until it returns
	Took      time.Duration // the statement's round trip
	Err       error         // the statement's; its callers then decide alone or share it
}

// LevelObserver is an [Observer] that also sees group commit's in-flight
// level move: how many of the limiter's statements run at once before its
// callers' Allow and AllowN gather in one statement. The level starts at 2
// and follows what the limiter measures (docs/throughput.md, "Group
// commit"), so that a load test or a dashboard can show where it settled.
type LevelObserver interface {
	// ObserveLevel is told where the level starts and each move. The
	// start comes as the limiter is made, From 0; a move, after the
	// statement that made it has returned, on the goroutine that ran it.
	// A limiter whose strategy does not gather (Range) is never observed.
	ObserveLevel(l LevelObservation)
}

// LevelObservation is one move of the in-flight level, as a
// [LevelObserver] sees it.
type LevelObservation struct {
	Namespace string
	Strategy  Strategy
	From, To  int // the statements that may run at once, before and after
}

// LeaseObserver is an [Observer] that also sees each give-back of a lease:
// the units a limit of many a second had taken ahead for a key, returned
// to its row once the key went quiet (docs/limits.md, "Leases").
type LeaseObserver interface {
	// ObserveGiveBack is called once the give-back's statement returned.
	ObserveGiveBack(ctx context.Context, g GiveBackObservation)
}

// GiveBackObservation is one give-back of a lease, as a [LeaseObserver]
// sees it.
type GiveBackObservation struct {
	Namespace string
	Strategy  Strategy
	Key       string
	Units     int64 // the units offered back
	Returned  bool  // whether the row took them: it had not moved on since
	Took      time.Duration
	Err       error
}

// observers are a limiter's Observer and the optional interfaces it
// implements, found once by New; each nil when absent.
type observers struct {
	decisions Observer
	batch     BatchObserver
	level     LevelObserver
	lease     LeaseObserver
}

func newObservers(o Observer) observers {
	batch, _ := o.(BatchObserver)
	level, _ := o.(LevelObserver)
	lease, _ := o.(LeaseObserver)
	return observers{decisions: o, batch: batch, level: level, lease: lease}
}

// observe runs fn, the operation op on key of n units, under the
// limiter's Observer, if it has one; id is its decision id.
func (l *limiter) observe(ctx context.Context, op Op, key, id string, n int, fn func(ctx context.Context) (Decision, error)) (Decision, error) {
	obs := l.observers.decisions
	if obs == nil {
		return fn(ctx)
	}
	o := Observation{Op: op, Namespace: l.cfg.Namespace, Strategy: l.cfg.Strategy, Key: key, ID: id, N: n}
	ctx = obs.StartDecision(ctx, o)
	begin := time.Now()
	o.Decision, o.Err = fn(ctx)
	o.Took = time.Since(begin)
	obs.EndDecision(ctx, o)
	return o.Decision, o.Err
}

// batches returns the batch hook of internal/batch that shows the
// BatchObserver, if any, each batch statement of the limiter of namespace
// and strategy; nil without one.
func (o observers) batches(namespace string, strategy Strategy) func(ctx context.Context, keys []string, took time.Duration, err error) {
	obs := o.batch
	if obs == nil {
		return nil
	}
	return func(ctx context.Context, keys []string, took time.Duration, err error) {
		obs.ObserveBatch(ctx, BatchObservation{Namespace: namespace, Strategy: strategy, Keys: keys, Took: took, Err: err})
	}
}

// levels returns the level hook of internal/batch that shows the
// LevelObserver, if any, each move of the in-flight level of the limiter of
// namespace and strategy; nil without one.
func (o observers) levels(namespace string, strategy Strategy) func(from, to int) {
	obs := o.level
	if obs == nil {
		return nil
	}
	return func(from, to int) {
		obs.ObserveLevel(LevelObservation{Namespace: namespace, Strategy: strategy, From: from, To: to})
	}
}

// giveBacks returns the give-back hook of internal/batch that shows the
// LeaseObserver, if any, each give-back of the limiter of namespace and
// strategy; nil without one.
func (o observers) giveBacks(namespace string, strategy Strategy) func(ctx context.Context, key string, units int64, returned bool, took time.Duration, err error) {
	obs := o.lease
	if obs == nil {
		return nil
	}
	return func(ctx context.Context, key string, units int64, returned bool, took time.Duration, err error) {
		obs.ObserveGiveBack(ctx, GiveBackObservation{
			Namespace: namespace, Strategy: strategy, Key: key, Units: units, Returned: returned, Took: took, Err: err,
		})
	}
}
