package pglimit

import (
	"context"
	"time"
)

// Observer sees the start and end of every decision of a limiter, as pgx's
// QueryTracer sees queries: it is how metrics and tracing plug into a
// limiter without wrapping it ([Config.Observer]). The decision methods
// (Allow, AllowN, AllowTx, AllowTxN, AllowAtMost, Reserve, Peek) are
// observed, whatever their outcome, bad input among them; Reset, Refund,
// [AllowAll], [Settle] and [Pause] are not. Its methods run on the
// caller's goroutine, around the decision, and must be safe for concurrent
// use: one Observer may serve many limiters, told apart by each
// observation's Namespace and Strategy.
//
// An Observer may also implement [BatchObserver], [LevelObserver] and
// [LeaseObserver]; New checks for them once.
type Observer interface {
	// StartDecision is called before a decision, with o's Decision, Err
	// and Took unset. The decision runs with the context it returns, so a
	// span it starts is the parent of the decision's own statement.
	StartDecision(ctx context.Context, o Observation) context.Context

	// EndDecision is called once the decision has ended, with the context
	// StartDecision returned and o complete.
	EndDecision(ctx context.Context, o Observation)
}

// Observation is one decision as an [Observer] sees it.
type Observation struct {
	// Op is the method called: "Allow", "AllowN", "AllowTx", "AllowTxN",
	// "AllowAtMost", "Reserve" or "Peek".
	Op string

	Namespace string   // the limiter's, as [Policy] reports it
	Strategy  Strategy // the limiter's
	Key       string   // as the caller gave it, which may be invalid
	N         int      // the units asked for: 1 for Allow and AllowTx

	Decision Decision      // what the method returned
	Err      error         // what the method returned
	Took     time.Duration // from StartDecision's return to the method's
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

// Names of the decision methods, as Observation.Op reports them.
const (
	opAllow       = "Allow"
	opAllowN      = "AllowN"
	opAllowTx     = "AllowTx"
	opAllowTxN    = "AllowTxN"
	opAllowAtMost = "AllowAtMost"
	opReserve     = "Reserve"
	opPeek        = "Peek"
)

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
