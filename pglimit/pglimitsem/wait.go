package pglimitsem

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
// lease ends. Each statement is bounded by Timeout.
func (s *Semaphore) Wait(ctx context.Context, key string) (Slot, error) {
	if err := pglimit.ValidateKey(key); err != nil {
		return Slot{}, err
	}
	w := s.waiting(key)
	defer s.doneWaiting(key)
	var q *place
	for {
		if q == nil {
			var err error
			if q, err = s.enqueue(ctx, key); err != nil {
				return Slot{}, err
			}
		}
		wake := s.wakeChan(w) // taken before the try: a release after it wakes this wait
		slot, queued, err := s.acquireInTurn(ctx, key, s.cfg.Timeout, func(ctx context.Context, scan func(pgx.Row) error) error {
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
		timer := time.NewTimer(max(min(slot.RetryAfter, s.cfg.WaitPoll), time.Millisecond))
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

// enqueue puts a waiter for key at the end of its queue.
func (s *Semaphore) enqueue(ctx context.Context, key string) (*place, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, s.cfg.Timeout, pglimit.ErrTimeout)
	defer cancel()
	var q place
	if err := s.db.QueryRow(ctx, s.stmts.enqueue, s.cfg.Namespace, key, s.placeTTL()).Scan(&q.arrived, &q.waiter); err != nil {
		return nil, s.wrap(ctx, fmt.Errorf("join the queue: %w", err))
	}
	return &q, nil
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
