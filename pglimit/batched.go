package pglimit

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
	"github.com/pglimit/cooldown/pglimit/internal/batch"
	"github.com/pglimit/cooldown/pglimit/internal/engine"
)

// newBatch returns l's group commit (internal/batch), with its
// statements st, or nil when l does not batch: l is not on Upsert or
// NoWait.
func newBatch(l *limiter, st engine.Batch) *batch.Group[Decision] {
	if l.cfg.Strategy == Range {
		return nil
	}
	c := batch.Config{
		DB: l.db, Timeout: l.cfg.Timeout, Expired: ErrTimeout,
		Namespace: l.cfg.Namespace, LockClass: l.lockClass,
		Contended: l.contended, T: l.emission, BurstT: l.burstT,
		Pool:     poolStats(l.db),
		Batched:  l.observers.batches(l.cfg.Namespace, l.cfg.Strategy),
		Level:    l.observers.levels(l.cfg.Namespace, l.cfg.Strategy),
		GaveBack: l.observers.giveBacks(l.cfg.Namespace, l.cfg.Strategy),
		SQL:      st.SQL, WaitSQL: st.WaitSQL, BackSQL: st.BackSQL,
	}
	if !l.single { // per-key limits among them
		c.General, c.Overrides = true, l.cfg.Overrides
	}
	return batch.New(c, (*batched)(l))
}

// poolStats returns the size of db's pool and its connections in use, for
// group commit to keep its in-flight level within: a *pgxpool.Pool's, or
// a database/sql pool's with a MaxOpenConns (pglimitsql). nil where db's
// bound is unknown.
func poolStats(db DB) func() (size, busy int) {
	switch p := db.(type) {
	case *pgxpool.Pool:
		return func() (int, int) {
			s := p.Stat()
			return int(s.MaxConns()), int(s.AcquiredConns())
		}
	case interface{ Stats() sql.DBStats }:
		if p.Stats().MaxOpenConnections == 0 {
			return nil // no bound
		}
		return func() (int, int) {
			s := p.Stats()
			return s.MaxOpenConnections, s.InUse
		}
	}
	return nil
}

// leases reports whether a limiter of c leases: a single GCRA limit on
// Upsert or NoWait that internal/batch leases.
func (c *Config) leases() bool {
	if c.Strategy == Range || c.Overrides || len(c.Limits) != 1 || c.Limits[0].Algorithm != GCRA {
		return false
	}
	_, _, t, burstT := c.Limits[0].micros()
	return batch.Leases(t, burstT)
}

// batched is a limiter as its group commit sees it: what builds its
// Decisions from the numbers a batch statement, or a lease, answered.
type batched limiter

var _ batch.Decider[Decision] = (*batched)(nil)

// Run decides n units of key with the call's own statement.
func (b *batched) Run(ctx context.Context, key string, n int) (Decision, error) {
	l := (*limiter)(b)
	return l.run(ctx, l.allowQuery(key, n))
}

// Answer is the Decision of a, a single GCRA limit's answer to n units of
// key.
func (b *batched) Answer(key string, n int, a batch.Answer) Decision {
	l := (*limiter)(b)
	switch a.Kind {
	case batch.Admitted:
		return l.withTicket(l.gcraDecision(true, a.TAT, a.Now, n), key, l.cfg.Limits, []int64{a.TAT})
	case batch.Leased:
		return Decision{
			Allowed: true, Granted: n, Remaining: int(a.Left), ResetAfter: micros(max(a.TAT-a.Now, 0)),
			Limit: l.cfg.Limits[0], policy: l.policy, at: a.Now, leased: true,
		}
	case batch.Refused:
		d := l.gcraDecision(false, a.TAT, a.Now, n)
		if a.Wait > 0 && (!a.Full || a.Wait < d.RetryAfter) {
			d.RetryAfter = a.Wait
			if n == 1 {
				d.next = a.Wait
			}
		}
		return d
	}
	return l.lostRace()
}

// General is the Decisions of calls calls of n units each on key, of which
// batch.general, having found row, admitted the first row.Granted: each
// call is evaluated on the row the calls before it left, under the
// limiter's limits or the key's own.
func (b *batched) General(key string, n, calls int, row batch.Row) ([]Decision, error) {
	l := (*limiter)(b)
	limits, policy, sp := l.cfg.Limits, l.policy, l.specs
	if l.cfg.Overrides {
		var err error
		if limits, policy, err = l.ownLimits(row.Rates, row.Bursts, nil, n, modeAllow, 0); err != nil {
			return nil, err
		}
		sp = specs(limits)
	}
	ds := make([]Decision, calls)
	state, tat := row.State, row.TAT
	for j := range ds {
		ev := arith.Evaluate(sp, state, tat, row.Now, int64(n), arith.Allow, 0)
		if ev.Allowed != (int64(j) < row.Granted) {
			return nil, fmt.Errorf("the database admitted %d of %d calls of %d units; the library's arithmetic differs at call %d on the same state: a bug; please report it",
				row.Granted, calls, n, j+1)
		}
		ds[j] = evaluated(ev, limits, policy, row.Now, n, modeAllow)
		if ev.Allowed {
			ds[j] = l.withTicket(ds[j], key, limits, ev.Anchors)
			var expires int64
			state, expires = arith.Admit(sp, state, tat, row.Now, int64(n))
			tat = &expires
		}
	}
	return ds, nil
}

// Follow is the refusal of n units that last, a statement's answer on the
// key sent since ago, implies, if it does.
func (b *batched) Follow(last Decision, n int, since time.Duration) (Decision, bool) {
	return (*limiter)(b).followGCRA(last, n, since)
}

// Failed is a batch.general statement's error as the limiter reports it.
func (b *batched) Failed(err error) error { return unknownZone(b.cfg.Limits, err) }
