package arith

import (
	"fmt"
	"strconv"
	"strings"
)

// Params names, for each limit, the SQL of its rate, emission interval
// and burst span, where they are not the limit's own constants: a per-key
// override's columns (internal/engine's keyLimits). nil means the constants.
type Params func(i int) (rate, t, burstT string)

// of returns limit l's (the i-th) rate, emission interval T and burst span
// Burst*T as SQL: p's columns, or l's constants.
func (p Params) of(l Limit, i int) (rate, t, burstT string) {
	if p != nil {
		return p(i)
	}
	return strconv.FormatInt(l.Rate, 10), strconv.FormatInt(l.T, 10), strconv.FormatInt(l.BurstT, 10)
}

// Shaped is the state column col if it has the shape of limits' state,
// else NULL: state of another length (the limits changed) counts as none.
func Shaped(limits []Limit, col string) string {
	return fmt.Sprintf("CASE WHEN cardinality(%s) = %d THEN %s END", col, 3*len(limits), col)
}

// DecisionSQL writes the SQL of a decision for limits: whether they admit
// the request, and if they do, the row's new state and expires_at. Its
// inputs are SQL too: state, the row's state column (NULL, or known to have
// the limits' shape: see Shaped), tat its expires_at in µs (NULL for a new
// key), and now the database time in µs, a column, as it is read many
// times. It computes what docs/limits.md defines, as Evaluate does.
//
// A single GCRA limit keeps its TAT in expires_at (tat) and no state.
// State written for other limits has three integers per limit, in the
// order of limits: GCRA [tat, 0, 0], FixedWindow [window start, count, 0]
// or, aligned to a calendar, [window start, count, window end],
// SlidingWindow [window start, previous count, current count].
//
// The expressions are written out in full, with no subqueries to name
// their parts: PostgreSQL prepares every node and expression of a plan each
// time it runs it, evaluated or not, and a subquery costs more to prepare
// than the few expressions it would save.
func DecisionSQL(limits []Limit, mode Mode, state, tat, now string, params Params) (admits, newState, newExpires string) {
	w := write(limits, mode, state, tat, now, "$4::bigint", params)
	admits = "(" + strings.Join(w.oks, " AND ") + ")"
	units := "$4::bigint"
	if mode == AtMost {
		units = fmt.Sprintf("least($4::bigint, %s)", strings.Join(w.caps, ", "))
	}
	newState, newExpires = w.after(limits, now, units)
	return admits, newState, newExpires
}

// BatchSQL writes the SQL of a batch statement's decision for limits on
// one key (Allow's): how many of calls requests of n units each (both
// SQL) the row admits, one after the other in order, each all or nothing;
// whether it admits the first (guard); and the row's new state and
// expires_at once granted (a column holding the former) have been. Its
// other inputs are DecisionSQL's.
//
// Every limit's capacity falls by exactly the units it admits at one clock
// reading, so the calls admitted in order are those that fit together:
// the fewest capacity/n of any limit, and at most calls.
func BatchSQL(limits []Limit, state, tat, now, n, calls, granted string, params Params) (count, guard, newState, newExpires string) {
	w := write(limits, Allow, state, tat, now, n, params)
	per := make([]string, len(w.caps))
	for i, c := range w.caps {
		per[i] = fmt.Sprintf("(%s) / %s", c, n)
	}
	count = fmt.Sprintf("greatest(least(%s, %s), 0)", calls, strings.Join(per, ", "))
	guard = "(" + strings.Join(w.oks, " AND ") + ")"
	newState, newExpires = w.after(limits, now, fmt.Sprintf("(%s * %s)", granted, n))
	return count, guard, newState, newExpires
}

// written is a decision's SQL for each limit, as write leaves it: the
// units it admits now (caps), whether it admits the request (oks), and
// its part of the new state and of expires_at, where {u} stands for the
// units admitted.
type written struct {
	caps, oks, next, expires []string
	rolled                   [][3]string // each limit's state rolled to now: a, b, c as in roll
}

// after is the new state and expires_at once units (SQL) are admitted.
func (w written) after(limits []Limit, now, units string) (newState, newExpires string) {
	newState = "NULL::bigint[]"
	if !Single(limits) {
		newState = "ARRAY[" + strings.ReplaceAll(strings.Join(w.next, ", "), "{u}", units) + "]"
	}
	newExpires = "greatest(" + now + ", " + strings.ReplaceAll(strings.Join(w.expires, ", "), "{u}", units) + ")"
	return newState, newExpires
}

// write writes each limit's part of a decision of n units (SQL) in mode.
func write(limits []Limit, mode Mode, state, tat, now, n string, params Params) written {
	single := Single(limits)
	var w written
	for i, l := range limits {
		P := l.Period
		R, T, BT := params.of(l, i)
		s := func(o int) string { return fmt.Sprintf("%s[%d]", state, 3*i+o) }
		var a, b, c, capacity string // the state rolled forward to now; the units admitted now
		switch l.Algorithm {
		case GCRA:
			if !single {
				tat = s(1)
			}
			a = fmt.Sprintf("greatest(%s, %s)", tat, now)
			capacity = fmt.Sprintf("(%s + %s - %s) / %s", now, BT, a, T)
			w.next = append(w.next, fmt.Sprintf("%s + {u} * %s", a, T), "0", "0")
			w.expires = append(w.expires, fmt.Sprintf("%s + {u} * %s", a, T))
		case FixedWindow:
			if l.Calendar != nil {
				// The window's end is kept in the state: the zone's rules
				// decide it once, when the window opens.
				live := fmt.Sprintf("%s < %s", now, s(3))
				start, end := l.Calendar.WindowSQL(now)
				a = fmt.Sprintf("CASE WHEN %s THEN %s ELSE %s END", live, s(1), start)
				b = fmt.Sprintf("CASE WHEN %s THEN %s%s ELSE 0 END", live, s(2), carrySQL(l, s(3)+" = "+start, s(2), R))
				e := fmt.Sprintf("CASE WHEN %s THEN %s ELSE %s END", live, s(3), end)
				capacity = fmt.Sprintf("%s - %s", R, b)
				w.next = append(w.next, a, b+" + {u}", e)
				w.expires = append(w.expires, e)
				c = e
				break
			}
			live := fmt.Sprintf("%s < %s + %d", now, s(1), P)
			a = fmt.Sprintf("CASE WHEN %s THEN %s ELSE %s END", live, s(1), now)
			b = fmt.Sprintf("CASE WHEN %s THEN %s%s ELSE 0 END", live, s(2), carrySQL(l, fmt.Sprintf("%s < %s + %d", now, s(1), 2*P), s(2), R))
			capacity = fmt.Sprintf("%s - %s", R, b)
			w.next = append(w.next, a, b+" + {u}", "0")
			w.expires = append(w.expires, fmt.Sprintf("%s + %d", a, P))
			c = fmt.Sprintf("%s + %d", a, P)
		case SlidingWindow:
			a = fmt.Sprintf("(%s / %d * %d)", now, P, P)
			b = fmt.Sprintf("CASE %s WHEN %s THEN %s WHEN %s - %d THEN %s ELSE 0 END", s(1), a, s(2), a, P, s(3))
			c = fmt.Sprintf("CASE WHEN %s = %s THEN %s ELSE 0 END", s(1), a, s(3))
			if l.Debt > 0 { // the previous window's count past Rate carries
				b = fmt.Sprintf("CASE %s WHEN %s THEN %s WHEN %s - %d THEN least(%s, %s) ELSE 0 END", s(1), a, s(2), a, P, s(3), R)
				c = fmt.Sprintf("CASE %s WHEN %s THEN %s WHEN %s - %d THEN greatest(%s - %s, 0) ELSE 0 END", s(1), a, s(3), a, P, s(3), R)
			}
			// The previous window's count weighs by its overlap with the
			// sliding window that ends now.
			capacity = fmt.Sprintf("%s - %s - ceil((%s)::numeric * (%d - %s %% %d) / %d)::bigint", R, c, b, P, now, P, P)
			w.next = append(w.next, a, b, c+" + {u}")
			w.expires = append(w.expires, fmt.Sprintf("%s + %d", a, 2*P)) // this window's count weighs until then
		}
		w.caps = append(w.caps, capacity)
		w.rolled = append(w.rolled, [3]string{a, b, c})
		switch mode {
		case Reserve: // GCRA only
			// a + n*T - now - BT <= maxDelay, with no product that a cost
			// past the key's own limits (an override's) could overflow.
			w.oks = append(w.oks, fmt.Sprintf("%s <= ($5::bigint + %s + %s - %s) / %s", n, BT, now, a, T))
		case AtMost: // any units at all
			w.oks = append(w.oks, fmt.Sprintf("(%s) >= 1", capacity))
		default:
			w.oks = append(w.oks, fmt.Sprintf("%s <= (%s)", n, capacity))
		}
	}
	return w
}

// SettleSQL writes the SQL of a settle for limits (Settle's): the units it
// charges (charged), and the row's new state and expires_at once it has,
// where units names the column that holds the former. Its inputs are SQL:
// DecisionSQL's, and anchors (a bigint[], one per limit), back and charge.
func SettleSQL(limits []Limit, state, tat, now, anchors, back, charge, units string, params Params) (charged, newState, newExpires string) {
	single := Single(limits)
	w := write(limits, Allow, state, tat, now, "1", params)
	rooms := []string{charge}
	var next, expires []string
	for i, l := range limits {
		P := l.Period
		R, T, BT := params.of(l, i)
		r := w.rolled[i]
		a, b, c := r[0], r[1], r[2]
		anchor := fmt.Sprintf("(%s)[%d]", anchors, i+1)
		s := func(o int) string { return fmt.Sprintf("%s[%d]", state, 3*i+o) }
		switch l.Algorithm {
		case GCRA:
			rooms = append(rooms, fmt.Sprintf("(%s + %s + %d * %s - %s) / %s", now, BT, l.Debt, T, a, T))
			tat := fmt.Sprintf("%s - greatest(least(%s * %s, %s - %s), 0) + %s * %s", a, back, T, anchor, now, units, T)
			next = append(next, tat, "0", "0")
			expires = append(expires, tat)
		case FixedWindow:
			rooms = append(rooms, fmt.Sprintf("%s + %d - %s", R, l.Debt, b))
			count := fmt.Sprintf("%s + %s - CASE WHEN %s = %s THEN least(%s, %s) ELSE 0 END", b, units, a, anchor, back, b)
			end := c // the window's end
			third := "0"
			if l.Calendar != nil {
				third = end
				next = append(next, a, count, third)
			} else {
				// Nothing counted in a window that has not begun: the
				// row's window stays, ended, as a decision leaves it.
				kept := fmt.Sprintf("(%s) = 0 AND %s >= %s + %d", count, now, s(1), P)
				next = append(next,
					fmt.Sprintf("CASE WHEN %s THEN %s ELSE %s END", kept, s(1), a),
					fmt.Sprintf("CASE WHEN %s THEN %s ELSE %s END", kept, s(2), count),
					fmt.Sprintf("CASE WHEN %s THEN %s ELSE 0 END", kept, s(3)))
			}
			expires = append(expires, fmt.Sprintf("%s + CASE WHEN (%s) > %s THEN %d ELSE 0 END", end, count, R, P))
		case SlidingWindow:
			rooms = append(rooms, fmt.Sprintf("(%s) + %d", w.caps[i], l.Debt))
			prev := fmt.Sprintf("%s - CASE WHEN %s - %d = %s THEN least(%s, %s) ELSE 0 END", b, a, P, anchor, back, b)
			count := fmt.Sprintf("%s + %s - CASE WHEN %s = %s THEN least(%s, %s) ELSE 0 END", c, units, a, anchor, back, c)
			next = append(next, a, prev, count)
			expires = append(expires, fmt.Sprintf("%s + %d + CASE WHEN (%s) > %s THEN %d ELSE 0 END", a, 2*P, count, R, P))
		}
	}
	charged = "greatest(least(" + strings.Join(rooms, ", ") + "), 0)"
	newState = "NULL::bigint[]"
	if !single {
		newState = "ARRAY[" + strings.Join(next, ", ") + "]"
	}
	return charged, newState, "greatest(" + now + ", " + strings.Join(expires, ", ") + ")"
}

// carrySQL is, for a limit with debt, the WHEN clause of a window's count
// that carries its debt into the next window (when, SQL), where count is
// the row's and rate the limit's: what Evaluate's carry computes. Empty
// for a limit without debt.
func carrySQL(l Limit, when, count, rate string) string {
	if l.Debt == 0 {
		return ""
	}
	return fmt.Sprintf(" WHEN %s THEN greatest(%s - %s, 0)", when, count, rate)
}

// RefundSQL writes the refund statement's new state and flags for limits
// (refund.general, in internal/queries).
func RefundSQL(limits []Limit) (state, flags string) {
	var next, ok []string
	for i, l := range limits {
		s := func(o int) string { return fmt.Sprintf("old.state[%d]", 3*i+o) }
		anchor := fmt.Sprintf("($3::bigint[])[%d]", i+1)
		switch l.Algorithm {
		case GCRA:
			hit := fmt.Sprintf("%s = %s", s(1), anchor)
			next = append(next, fmt.Sprintf("CASE WHEN %s THEN %s - $4::bigint * ($5::bigint[])[%d] ELSE %s END", hit, s(1), i+1, s(1)), s(2), s(3))
			ok = append(ok, hit)
		case FixedWindow:
			hit := fmt.Sprintf("%s = %s", s(1), anchor)
			next = append(next, s(1), fmt.Sprintf("CASE WHEN %s THEN greatest(%s - $4::bigint, 0) ELSE %s END", hit, s(2), s(2)), s(3))
			ok = append(ok, hit)
		case SlidingWindow:
			// The units counted in the window that began at the anchor:
			// the current one, or the previous one once a window passed.
			P := l.Period
			current := fmt.Sprintf("%s = %s", s(1), anchor)
			previous := fmt.Sprintf("%s = %s + %d", s(1), anchor, P)
			next = append(next, s(1),
				fmt.Sprintf("CASE WHEN %s THEN greatest(%s - $4::bigint, 0) ELSE %s END", previous, s(2), s(2)),
				fmt.Sprintf("CASE WHEN %s THEN greatest(%s - $4::bigint, 0) ELSE %s END", current, s(3), s(3)))
			ok = append(ok, fmt.Sprintf("(%s OR %s)", current, previous))
		}
	}
	return "ARRAY[" + strings.Join(next, ", ") + "]", "ARRAY[" + strings.Join(ok, ", ") + "]"
}
