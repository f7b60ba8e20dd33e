package pglimitsem

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit"
)

// Level is a priority level of a semaphore ([Config.Levels]), in the
// manner of Kubernetes API Priority and Fairness: a guaranteed share of
// every key's slots that it may partly lend, and a ceiling up to which it
// may borrow what others do not use.
type Level struct {
	// Name names the level. Same rules as a key; unique in a semaphore.
	Name string

	// Min is the level's guarantee: while it holds fewer than Min slots of
	// a key, Min-Lend of them are kept free for it, so that it takes one
	// at once whatever the other levels do.
	Min int

	// Lend is how many of Min the other levels may borrow while this one
	// does not use them; from 0 to Min. A level that lends gets those back
	// only as free slots, which it competes for with the borrowers.
	Lend int

	// Max is the level's ceiling: it never holds more than Max slots of a
	// key. From Min (no borrowing) to Slots.
	Max int
}

// ErrUnknownLevel reports a level that [Semaphore.AcquireLevel] or
// [Semaphore.WaitLevel] was not configured with. It reaches no database.
var ErrUnknownLevel = errors.New("pglimitsem: unknown level")

// maxLevels bounds Config.Levels.
const maxLevels = 16

// levels is Config.Levels, checked: each level's index by name, and the
// statement's arrays of names and of the slots each keeps for itself.
type levels struct {
	index map[string]int
	names []string
	keep  []int32
	max   []int32
}

// newLevels checks ls against a semaphore of slots.
func newLevels(ls []Level, slots int) (levels, error) {
	if len(ls) > maxLevels {
		return levels{}, fmt.Errorf("%w: Levels: at most %d, got %d", pglimit.ErrInvalidConfig, maxLevels, len(ls))
	}
	out := levels{index: make(map[string]int, len(ls))}
	total := 0
	for i, l := range ls {
		if err := pglimit.ValidateKey(l.Name); err != nil {
			return levels{}, fmt.Errorf("%w: Levels[%d].Name: %w", pglimit.ErrInvalidConfig, i, err)
		}
		if _, dup := out.index[l.Name]; dup {
			return levels{}, fmt.Errorf("%w: Levels[%d]: %q named twice", pglimit.ErrInvalidConfig, i, l.Name)
		}
		switch {
		case l.Min < 0 || l.Max < 1 || l.Max > slots:
			return levels{}, fmt.Errorf("%w: Levels[%d] (%q): Min must not be negative and Max must be from 1 to Slots (%d); got Min %d, Max %d",
				pglimit.ErrInvalidConfig, i, l.Name, slots, l.Min, l.Max)
		case l.Min > l.Max:
			return levels{}, fmt.Errorf("%w: Levels[%d] (%q): Min %d is above Max %d", pglimit.ErrInvalidConfig, i, l.Name, l.Min, l.Max)
		case l.Lend < 0 || l.Lend > l.Min:
			return levels{}, fmt.Errorf("%w: Levels[%d] (%q): Lend must be from 0 to Min (%d), got %d", pglimit.ErrInvalidConfig, i, l.Name, l.Min, l.Lend)
		}
		total += l.Min
		out.index[l.Name] = i
		out.names = append(out.names, l.Name)
		out.keep = append(out.keep, int32(l.Min-l.Lend))
		out.max = append(out.max, int32(l.Max))
	}
	if total > slots {
		return levels{}, fmt.Errorf("%w: Levels: their Min add up to %d, above Slots (%d)", pglimit.ErrInvalidConfig, total, slots)
	}
	return out, nil
}

// AcquireLevel is Acquire for a request of a priority level of
// [Config.Levels]. It takes a free slot of key only while the level holds
// fewer than its Max, and a slot is free beyond those the other levels
// keep: each keeps Min-Lend slots free for itself while it holds fewer
// than that. So a level finds a slot at once while it holds fewer than
// Min-Lend, never behind the other levels' work; past that it competes
// for free slots, and borrows what the others do not use, up to its Max.
//
// Like Acquire it does not queue: a refusal writes nothing, and its
// RetryAfter is the hold time's hint, or WaitPoll when the level's share
// refused it with slots free. A level the semaphore was not configured
// with is [ErrUnknownLevel] and reaches no database. Acquisitions of a
// key at the same instant may each take a slot that their statements'
// snapshots saw free, so that a guarantee may be short by at most those
// acquisitions until they release. Use a key either with levels or
// without: slots Acquire and Wait take count as held by no level.
func (s *Semaphore) AcquireLevel(ctx context.Context, key, level string) (Slot, error) {
	i, ok := s.levels.index[level]
	if !ok {
		return Slot{}, fmt.Errorf("%w: %q", ErrUnknownLevel, level)
	}
	return s.observed(ctx, key, func() (Slot, error) {
		slot, _, err := s.acquireInTurn(ctx, key, s.cfg.Timeout, func(ctx context.Context, scan func(pgx.Row) error) error {
			return scan(s.db.QueryRow(ctx, s.stmts.acquireLevel, s.cfg.Namespace, key, s.cfg.Slots, s.ttl, s.lockSeed,
				level, s.levels.names, s.levels.keep, s.levels.max[i]))
		}, &place{})
		return slot, err
	})
}

// WaitLevel is Wait for a waiter of a priority level of [Config.Levels],
// served within its level and never behind another level's waiters.
//
// It takes a slot of key as soon as its level may take one, as
// AcquireLevel would, waiting while its level may take none, until ctx
// ends. The waiters of a level are served in the order they began to
// wait, from every instance; a level's waiters are never queued behind
// another level's: while a level holds fewer slots than it keeps for
// itself (Min-Lend), one of those is free and its first waiter takes it
// at its next try, whatever waits at the other levels. Past that, the
// levels' waiters compete for the free slots beyond what the others
// keep, each level up to its Max, and the first of each level to try
// takes one.
//
// Each try is one statement, as Wait's, and a waiter wakes, keeps its
// place and leaves the queue as Wait's does. The first try, before it
// joins, takes a slot as AcquireLevel would while no waiter of its level
// is queued, so that a level within its guarantee never joins the queue.
// AcquireLevel does not queue: it takes a slot its level may take ahead
// of the level's waiters. A
// level the semaphore was not configured with is [ErrUnknownLevel], and
// a bad key [pglimit.ErrInvalidKey]; neither reaches the database. Use a
// key either with levels or without: the places of Wait's and WaitFlow's
// waiters belong to no level and hold no level's waiter back.
func (s *Semaphore) WaitLevel(ctx context.Context, key, level string) (Slot, error) {
	i, ok := s.levels.index[level]
	if !ok {
		return Slot{}, fmt.Errorf("%w: %q", ErrUnknownLevel, level)
	}
	return s.wait(ctx, key, nil, i)
}
