package pglimitsem

import (
	"context"
	"crypto/rand"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pglimit/cooldown/pglimit"
)

// place is a waiter's place in a key's queue (pglimit_slot_waiters): when
// it arrived on the database's clock, in µs, and its id.
type place struct {
	arrived int64
	waiter  string
}

// Wait takes a slot of key, waiting while all are held, until ctx ends.
// Callers of Wait are served in the order they began to wait, from every
// instance: a waiter takes a slot only while fewer waiters of the key are
// ahead of it than slots are free. [Semaphore.Acquire] does not queue: it
// takes a free slot, if there is one, ahead of the waiters.
//
// A waiter asks again when a Release of the key wakes it, in its own
// process or, with Config.Listen, heard of from another instance, and
// otherwise every WaitPoll. It keeps its place by renewing it at
// each try; the place of a waiter that died stops counting after
// max(2s, 20 WaitPoll), which bounds how long it holds up those behind it.
// When ctx ends, Wait leaves the queue and returns ctx's error (its
// cause); a slot taken by a statement that ctx cut off returns when its
// lease ends. Each statement is bounded by Timeout. The waiter's id is
// made before it joins the queue, so that a join ctx cut off, which may
// have committed unseen, is taken out by that id, within Timeout, on a
// goroutine of its own while Wait returns. Only a join that the server
// still runs when that removal reads the queue, and that outlives the
// driver's cancel request, leaves its place behind, counted until it
// lapses.
func (s *Semaphore) Wait(ctx context.Context, key string) (Slot, error) {
	return s.wait(ctx, key, nil, -1)
}

// ErrInvalidFlow reports a [Flow] that [Semaphore.WaitFlow] refuses
// before it reaches the database: a Name that is not a valid key, or a
// Weight out of range.
var ErrInvalidFlow = errors.New("pglimitsem: invalid flow")

// ErrQueueFull reports a waiter that [Semaphore.WaitFlow] refused because
// its flow already had Config.FlowQueue live places in the key's queue.
// The Slot returned with it has a RetryAfter.
var ErrQueueFull = errors.New("pglimitsem: the flow's queue is full")

// Flow is who a waiter of [Semaphore.WaitFlow] waits for: a tenant, such
// as an organisation, and its weight.
type Flow struct {
	// Name names the flow. Same rules as a key.
	Name string

	// Weight is the flow's weight, from 1 to 10,000: while flows wait,
	// each holds slots of the key in proportion to its weight. A waiter
	// keeps the weight it joined with, and a change applies to the flow's
	// waiters that join after it; a weight set with
	// [Semaphore.SetFlowWeight] wins over it, for every waiter at once.
	Weight int
}

// WaitFlow is Wait for a waiter of flow, with weighted fair share
// across the flows that wait for the key. While flows are backlogged,
// each holds the key's slots in proportion to its Weight; a flow with no
// waiter lends its share to the others, so that no slot stays free while
// a waiter waits (work-conserving). Across flows a free slot goes to the
// waiter whose flow is furthest below its share: the lowest (slots its
// flow holds + its place among the flow's waiters) / Weight, ties going
// to the earliest; within a flow, waiters are served in arrival order.
// Each try is one statement, as Wait's; the first, while no one waits
// for the key, takes a free slot without joining the queue, and a waiter
// that finds others waiting joins the queue and makes its first try in
// turn in one statement.
//
// As with Wait, a waiter whose ctx ends while it joins the queue is taken
// out of it by its id.
//
// A flow's queue is bounded by Config.FlowQueue: past it, WaitFlow
// returns [ErrQueueFull] with a Slot whose RetryAfter is the hold time
// ([Semaphore.HoldTime]). A bad Flow is [ErrInvalidFlow], a bad key
// [pglimit.ErrInvalidKey], and neither reaches the database.
//
// Use a key either with WaitFlow or without flows: slots that Acquire
// and Wait take belong to no flow and count only as held, and Acquire
// takes a free slot ahead of every waiter.
func (s *Semaphore) WaitFlow(ctx context.Context, key string, flow Flow) (Slot, error) {
	if err := checkFlow(flow); err != nil {
		return Slot{}, err
	}
	return s.wait(ctx, key, &flow, -1)
}

// SetFlowWeight sets the weight of flow for every key and instance of
// this semaphore's namespace. From the next try of each waiter, it wins
// over the weight the flow's waiters name, until
// [Semaphore.ResetFlowWeight]. A weight out of 1 to 10,000 or a bad flow
// name is [ErrInvalidFlow] and writes nothing. The weights live in
// pglimit_slot_flows, one row per flow set; the Cleaner leaves them.
func (s *Semaphore) SetFlowWeight(ctx context.Context, flow string, weight int) error {
	if err := checkFlow(Flow{Name: flow, Weight: weight}); err != nil {
		return err
	}
	return s.exec(ctx, s.stmts.setWeight, s.cfg.Namespace, flow, weight)
}

// ResetFlowWeight deletes the weight SetFlowWeight set for flow, so that
// the weights its waiters name count again. A flow with none set is left
// as it is. A bad flow name is [ErrInvalidFlow].
func (s *Semaphore) ResetFlowWeight(ctx context.Context, flow string) error {
	if err := checkFlow(Flow{Name: flow, Weight: 1}); err != nil {
		return err
	}
	return s.exec(ctx, s.stmts.resetWeight, s.cfg.Namespace, flow)
}

// exec runs sql within Timeout.
func (s *Semaphore) exec(ctx context.Context, sql string, args ...any) error {
	ctx, cancel := context.WithTimeoutCause(ctx, s.cfg.Timeout, pglimit.ErrTimeout)
	defer cancel()
	if _, err := s.db.Exec(ctx, sql, args...); err != nil {
		return s.wrap(ctx, err)
	}
	return nil
}

// checkFlow is ErrInvalidFlow for a flow with a bad name or weight.
func checkFlow(flow Flow) error {
	if err := pglimit.ValidateKey(flow.Name); err != nil {
		return fmt.Errorf("%w: Name: %w", ErrInvalidFlow, err)
	}
	if flow.Weight < 1 || flow.Weight > maxWeight {
		return fmt.Errorf("%w: Weight must be from 1 to %d, got %d", ErrInvalidFlow, maxWeight, flow.Weight)
	}
	return nil
}

// wait is Wait, for a waiter of flow unless it is nil, or of the level of
// index level unless it is negative.
func (s *Semaphore) wait(ctx context.Context, key string, flow *Flow, level int) (Slot, error) {
	if err := pglimit.ValidateKey(key); err != nil {
		return Slot{}, err
	}
	w := s.waiting(key)
	defer s.doneWaiting(key)
	var (
		q     *place
		wake  <-chan struct{}
		last  Slot // the refusal of the last try
		tried bool // a try was made since the last wait
	)
	if level >= 0 {
		// A slot the level may take, with none of its waiters ahead, is
		// taken at once, without joining the queue: one statement, as
		// AcquireLevel's.
		slot, _, err := s.acquireInTurn(ctx, key, s.cfg.Timeout, func(ctx context.Context, scan func(pgx.Row) error) error {
			return scan(s.db.QueryRow(ctx, s.stmts.takeLevel, s.cfg.Namespace, key, s.cfg.Slots, s.ttl, s.lockSeed,
				s.levels.names[level], s.levels.names, s.levels.keep, s.levels.max[level]))
		}, &place{})
		if err != nil || slot.Acquired {
			return slot, err
		}
	}
	if flow != nil {
		// A free slot with no one waiting is taken at once, without
		// joining the queue: one statement, as Acquire's.
		slot, _, err := s.acquireInTurn(ctx, key, s.cfg.Timeout, func(ctx context.Context, scan func(pgx.Row) error) error {
			return scan(s.db.QueryRow(ctx, s.stmts.takeFlow, s.cfg.Namespace, key, s.cfg.Slots, s.ttl, s.lockSeed, flow.Name))
		}, &place{})
		if err != nil || slot.Acquired {
			return slot, err
		}
		// Else the waiter joins the queue and tries in turn, in one
		// statement; one that lost a race for a free slot, or whose
		// flow's queue is full, joins below (and learns it).
		id := newWaiterID()
		var arrived *int64
		wake = s.wakeChan(w)
		slot, joined, err := s.acquireInTurn(ctx, key, s.cfg.Timeout, func(ctx context.Context, scan func(pgx.Row) error) error {
			return scan(s.db.QueryRow(ctx, s.stmts.joinFlow, s.cfg.Namespace, key, s.cfg.Slots, s.ttl, s.lockSeed, flow.Name,
				id, s.placeTTL(), flow.Weight, s.cfg.FlowQueue))
		}, &place{}, &arrived)
		switch {
		case err != nil:
			s.joinedUnseen(ctx, key, id, err)
			return slot, err
		case slot.Acquired:
			return slot, nil
		case joined && arrived != nil:
			q, last, tried = &place{arrived: *arrived, waiter: id.text()}, slot, true
		}
	}
	for {
		if !tried {
			if q == nil {
				var err error
				if q, err = s.enqueue(ctx, key, flow, level); err != nil {
					if errors.Is(err, ErrQueueFull) {
						return Slot{RetryAfter: s.HoldTime()}, err
					}
					return Slot{}, err
				}
			}
			wake = s.wakeChan(w) // taken before the try: a release after it wakes this wait
			slot, queued, err := s.acquireInTurn(ctx, key, s.cfg.Timeout, func(ctx context.Context, scan func(pgx.Row) error) error {
				switch {
				case level >= 0:
					return scan(s.db.QueryRow(ctx, s.stmts.waitLevel, s.cfg.Namespace, key, s.cfg.Slots, s.ttl, s.lockSeed, q.arrived, q.waiter, s.placeTTL(),
						s.levels.names[level], s.levels.names, s.levels.keep, s.levels.max[level]))
				case flow != nil:
					return scan(s.db.QueryRow(ctx, s.stmts.waitFlow, s.cfg.Namespace, key, s.cfg.Slots, s.ttl, s.lockSeed, q.arrived, q.waiter, s.placeTTL(), flow.Name))
				}
				return scan(s.db.QueryRow(ctx, s.stmts.wait, s.cfg.Namespace, key, s.cfg.Slots, s.ttl, s.lockSeed, q.arrived, q.waiter, s.placeTTL()))
			}, q)
			switch {
			case err != nil:
				s.leave(ctx, key, q)
				return Slot{}, err
			case slot.Acquired:
				return slot, nil
			case !queued:
				q = nil // its place lapsed: it joins again, at the end
			}
			last = slot
		}
		tried = false
		timer := time.NewTimer(max(min(last.RetryAfter, s.cfg.WaitPoll), time.Millisecond))
		select {
		case <-ctx.Done():
			timer.Stop()
			s.leave(ctx, key, q)
			return Slot{}, context.Cause(ctx)
		case <-wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// placeTTL is how long a waiter's place lasts unless renewed, in µs.
func (s *Semaphore) placeTTL() int64 {
	return max(2*time.Second, 20*s.cfg.WaitPoll).Microseconds()
}

// enqueue puts a waiter for key, of flow unless it is nil, or of the
// level of index level unless it is negative, at the end of its queue. A
// flow whose queue is full is ErrQueueFull.
//
// The waiter's id is made here, before the join. A join that failed once
// the driver had sent it (ctx ended while it ran, say) may have committed
// all the same, unseen; its place is then taken out by that id, past
// ctx's end and within Timeout, in a goroutine of its own so that the
// caller returns by its deadline. A join the server refused wrote
// nothing, and one never sent (no connection to be had) is left alone.
func (s *Semaphore) enqueue(ctx context.Context, key string, flow *Flow, level int) (*place, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, s.cfg.Timeout, pglimit.ErrTimeout)
	defer cancel()
	id := newWaiterID()
	q := place{waiter: id.text()}
	var row pgx.Row
	switch {
	case level >= 0:
		row = s.db.QueryRow(ctx, s.stmts.enqueueLevel, s.cfg.Namespace, key, s.placeTTL(), s.levels.names[level], id)
	case flow != nil:
		row = s.db.QueryRow(ctx, s.stmts.enqueueFlow, s.cfg.Namespace, key, s.placeTTL(), flow.Name, flow.Weight, s.cfg.FlowQueue, id)
	default:
		row = s.db.QueryRow(ctx, s.stmts.enqueue, s.cfg.Namespace, key, s.placeTTL(), id)
	}
	if err := row.Scan(&q.arrived); err != nil {
		if flow != nil && errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("%w: flow %q has %d places in the queue of key %q", ErrQueueFull, flow.Name, s.cfg.FlowQueue, key)
		}
		s.joinedUnseen(ctx, key, id, err)
		return nil, s.wrap(ctx, fmt.Errorf("join the queue: %w", err))
	}
	return &q, nil
}

// joinedUnseen takes waiter id out of key's queue after its join failed
// with err, unless the join never ran: it was not sent, or the server
// refused it. It does so on a goroutine of its own, within Timeout even
// though ctx ended. A failure is not reported: the place lapses.
func (s *Semaphore) joinedUnseen(ctx context.Context, key string, id waiterID, err error) {
	var refused *pgconn.PgError
	if !id.sent.Load() || errors.As(err, &refused) {
		return
	}
	s.leaving.Add(1)
	go func() {
		defer s.leaving.Add(-1)
		ctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), s.cfg.Timeout, pglimit.ErrTimeout)
		defer cancel()
		_, _ = s.db.Exec(ctx, s.stmts.leaveJoined, s.cfg.Namespace, key, id.text())
	}()
}

// waiterID is a waiter's id (a random UUID), made before it joins the
// queue, as its join statement's argument. It notes when the driver
// encodes it, which pgx does once it holds a connection, just before it
// sends the statement: a join that failed before that never ran.
type waiterID struct {
	id   [16]byte
	sent *atomic.Bool
}

func newWaiterID() waiterID {
	w := waiterID{sent: new(atomic.Bool)}
	_, _ = rand.Read(w.id[:])     // never fails
	w.id[6] = w.id[6]&0x0f | 0x40 // version 4
	w.id[8] = w.id[8]&0x3f | 0x80 // RFC 9562 variant
	return w
}

// UUIDValue encodes the id for pgx where it knows the parameter's type
// (a prepared or described statement), and notes that the statement is
// being sent.
func (w waiterID) UUIDValue() (pgtype.UUID, error) {
	w.sent.Store(true)
	return pgtype.UUID{Bytes: w.id, Valid: true}, nil
}

// Value encodes the id as text where pgx does not know the parameter's
// type (QueryExecModeExec and the simple protocol, as behind PgBouncer),
// and notes that the statement is being sent.
func (w waiterID) Value() (driver.Value, error) {
	w.sent.Store(true)
	return w.text(), nil
}

// text is the id as PostgreSQL writes a uuid. (Not String: pgx would
// encode a fmt.Stringer argument with it, and the id would not note when
// it is sent.)
func (w waiterID) text() string {
	h := hex.EncodeToString(w.id[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// leave takes a waiter that gave up out of key's queue, within Timeout
// even though ctx ended. A failure is not reported: the place lapses.
func (s *Semaphore) leave(ctx context.Context, key string, q *place) {
	if q == nil {
		return
	}
	ctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), s.cfg.Timeout, pglimit.ErrTimeout)
	defer cancel()
	_, _ = s.db.Exec(ctx, s.stmts.leave, s.cfg.Namespace, key, q.arrived, q.waiter)
}

// wakeChan is the channel that the next Release of w's key closes.
func (s *Semaphore) wakeChan(w *waking) <-chan struct{} {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	return w.ch
}

// waiting registers a caller of Wait for key in this process, and starts
// the listener with the first.
func (s *Semaphore) waiting(key string) *waking {
	tag := tagOf(key)
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	s.startListening()
	if s.wake == nil {
		s.wake = map[string]*waking{}
	}
	w := s.wake[tag]
	if w == nil {
		w = &waking{ch: make(chan struct{})}
		s.wake[tag] = w
	}
	w.callers++
	return w
}

// doneWaiting unregisters one, forgetting the key with its last caller,
// and the map with the last key: a map keeps the table of its busiest
// moment.
func (s *Semaphore) doneWaiting(key string) {
	tag := tagOf(key)
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	if w := s.wake[tag]; w != nil {
		if w.callers--; w.callers == 0 {
			delete(s.wake, tag)
		}
	}
	if len(s.wake) == 0 {
		s.wake = nil
	}
}

// woken wakes this process's callers of Wait for key: a slot was
// released.
func (s *Semaphore) woken(key string) {
	s.wakeMu.Lock()
	none := len(s.wake) == 0
	s.wakeMu.Unlock()
	if !none {
		s.wokenTag(tagOf(key))
	}
}

// wokenTag wakes this process's callers of Wait for the key of tag.
func (s *Semaphore) wokenTag(tag string) {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	if w := s.wake[tag]; w != nil {
		close(w.ch)
		w.ch = make(chan struct{})
	}
}

// wakeAll wakes every caller of Wait in this process.
func (s *Semaphore) wakeAll() {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	for _, w := range s.wake {
		close(w.ch)
		w.ch = make(chan struct{})
	}
}
