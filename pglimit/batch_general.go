package pglimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// generalBatch writes batch.general, the batch statement of any set of
// limits, for l's limits on table: wait and patience as batch.allow's.
func generalBatch(l *limiter, table, column, wait, patience string) string {
	var own *overrideSQL // nil: the limiter's own limits
	args := queries.Args{
		"table": table, "setting": column, "wait": wait, "patience": patience,
		"state": arith.Shaped(l.specs, "t.state"), "width": strconv.Itoa(3 * len(l.specs)),
		"own": "", "own_cols": "", "own_d": "", "own_c": "", "own_agg": "",
	}
	if l.cfg.Overrides {
		o := newOverrideSQL(l.cfg.Limits)
		own = &o
		args["own"] = o.lateral(pgx.Identifier{l.cfg.Schema, overridesTable}.Sanitize(), "$1", "r.key", "own")
		args["own_cols"] = ", " + o.columns("c")
		args["own_d"] = ", " + o.out("d", false)
		args["own_c"] = ", " + o.out("c", false)
		args["own_agg"] = ", array_agg(rates), array_agg(bursts)"
	}
	count, _, state, expires := arith.BatchSQL(l.specs, "x.state", "x.tat", "x.now", "x.n", "x.calls", "g.granted", own.params("x."))
	_, guard, _, _ := arith.BatchSQL(l.specs, "c.state", "c.tat", "c.now", "c.n", "1", "1", own.params("c."))
	refuses := "NOT " + guard
	if l.cfg.Overrides {
		// A row the limits cannot use decides nothing: no call fits it,
		// and it is no refusal either.
		count = "CASE WHEN x.ok THEN " + count + " ELSE 0 END"
		guard, refuses = "(c.ok AND "+guard+")", "(c.ok AND "+refuses+")"
	}
	args["guard"], args["refuses"], args["count"], args["new_state"], args["new_expires"] = guard, refuses, count, state, expires
	return queries.Text("batch.general", args)
}

// queryGeneral is query for a batcher of any set of limits: it runs sql,
// batch.general in one of its variants, for bt's entries, and answers the
// calls of those it decided. It returns those it did not.
func (b *batcher) queryGeneral(ctx context.Context, sql string, bt []*entry) (skipped []*entry, err error) {
	var in struct {
		keys     []string
		n, calls []int64
	}
	for _, e := range bt {
		if len(e.calls) == 0 {
			continue
		}
		in.keys = append(in.keys, e.key)
		in.n = append(in.n, int64(e.n))
		in.calls = append(in.calls, int64(len(e.calls)))
	}
	if len(in.keys) == 0 {
		return nil, nil // every caller left before the batch was sent
	}
	var out struct {
		keys          []string
		granted, now  []int64
		state         [][]int64
		stated        []bool
		tat           []*int64
		rates, bursts [][]int64 // the keys' own limits' (Config.Overrides)
	}
	dest := []any{&out.keys, &out.granted, &out.state, &out.stated, &out.tat, &out.now, nil}
	if b.l.cfg.Overrides {
		dest = append(dest, &out.rates, &out.bursts)
	}
	err = b.l.db.QueryRow(ctx, sql, b.l.args.namespace, in.keys, in.n, b.l.args.lockClass, in.calls).Scan(dest...)
	if err != nil {
		return nil, unknownZone(b.l.cfg.Limits, err)
	}
	lengths := []int{len(out.granted), len(out.state), len(out.stated), len(out.tat), len(out.now)}
	if b.l.cfg.Overrides {
		lengths = append(lengths, len(out.rates), len(out.bursts))
	}
	for _, k := range lengths {
		if k != len(out.keys) {
			return nil, errors.New("batch answer arrays differ in length")
		}
	}
	byKey := make(map[string]int, len(out.keys))
	for i, k := range out.keys {
		byKey[k] = i
	}
	for _, e := range bt {
		i, ok := byKey[e.key]
		switch {
		case !ok:
			skipped = append(skipped, e)
			continue
		case len(e.calls) == 0:
			continue
		}
		var state []int64
		if out.stated[i] {
			state = out.state[i]
		}
		limits, policy := b.l.cfg.Limits, b.l.policy
		var err error
		if b.l.cfg.Overrides {
			limits, policy, err = b.l.ownLimits(out.rates[i], out.bursts[i], nil, e.n, modeAllow, 0)
		}
		if err == nil {
			err = b.l.decideCalls(e, limits, policy, state, out.tat[i], out.now[i], out.granted[i])
		}
		if err != nil {
			for _, c := range e.calls {
				c.d, c.err = Decision{}, err
			}
		}
		e.last = e.calls[len(e.calls)-1].d
	}
	return skipped, nil
}

// decideCalls writes the Decision of each of e's calls, of which the
// statement admitted the first granted, one after the other, on the key's
// row as it read it (state, tat) at now: each call is evaluated on the row
// the calls before it left, under limits (policy's).
func (l *limiter) decideCalls(e *entry, limits []Limit, policy *Policy, state []int64, tat *int64, now, granted int64) error {
	n := int64(e.n)
	sp := l.specs
	if l.cfg.Overrides {
		sp = specs(limits)
	}
	for j, c := range e.calls {
		ev := arith.Evaluate(sp, state, tat, now, n, arith.Allow, 0)
		if ev.Allowed != (int64(j) < granted) {
			return fmt.Errorf("the database admitted %d of %d calls of %d units; the library's arithmetic differs at call %d on the same state: a bug; please report it",
				granted, len(e.calls), n, j+1)
		}
		c.d = evaluated(ev, limits, policy, now, e.n, modeAllow)
		if ev.Allowed {
			c.d = l.withTicket(c.d, e.key, limits, ev.Anchors)
			var expires int64
			state, expires = arith.Admit(sp, state, tat, now, n)
			tat = &expires
		}
	}
	return nil
}
