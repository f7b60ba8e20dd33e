package pglimit

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// The general statement (general.allow, in internal/queries) decides for
// any set of limits on the Upsert and NoWait tables; general.peek is Peek's.

// Modes of the general statement.
const (
	modeAllow   = 0 // admit n or refuse
	modeAtMost  = 1 // admit up to n
	modeReserve = 2 // admit n within a maximum delay (GCRA only)
	modes       = 3
)

// generalStatements are the general statements of one limiter, by mode.
type generalStatements struct {
	own, tx [modes]string // own: in the statement's own transaction; tx: in a caller's
	peek    string
}

// newGeneralStatements writes the general statements for limits on table.
// Reserve's is written only when every limit is GCRA: Reserve refuses other
// limits before it reaches the database.
func newGeneralStatements(limits []Limit, table, column, lock string) generalStatements {
	var g generalStatements
	for mode := range modes {
		if mode == modeReserve && !allGCRA(limits) {
			continue
		}
		admits, state, expires := decision(limits, mode, "x.state", "x.tat", "x.now", nil)
		guard, _, _ := decision(limits, mode, "c.state", "c.tat", "c.now", nil)
		stmt := func(column string) string {
			return queries.Text("general.allow", queries.Args{
				"table": table, "setting": column, "lock": lock, "admits": admits, "new_state": state,
				"new_expires": expires, "guard": guard, "state": shaped(limits, "t.state"),
			})
		}
		g.own[mode], g.tx[mode] = stmt(column), stmt(noSettingColumn)
	}
	g.peek = queries.Text("general.peek", queries.Args{"table": table})
	return g
}

// limitParams names, for each limit, the SQL of its rate, emission
// interval and burst span, where they are not the limit's own constants:
// a per-key override's columns (overrides.go), read from the row alias
// the names are prefixed with. nil means the constants.
type limitParams func(i int) (rate, t, burstT string)

// of returns limit l's (the i-th) rate, emission interval T and burst span
// Burst*T as SQL: p's columns, or l's constants.
func (p limitParams) of(l Limit, i int) (rate, t, burstT string) {
	if p != nil {
		return p(i)
	}
	_, R, T, BT := l.micros()
	return strconv.FormatInt(R, 10), strconv.FormatInt(T, 10), strconv.FormatInt(BT, 10)
}

// shaped is the state column col if it has the shape of limits' state,
// else NULL: state of another length (the limits changed) counts as none.
func shaped(limits []Limit, col string) string {
	return fmt.Sprintf("CASE WHEN cardinality(%s) = %d THEN %s END", col, 3*len(limits), col)
}

func allGCRA(limits []Limit) bool {
	for _, l := range limits {
		if l.Algorithm != GCRA {
			return false
		}
	}
	return true
}

// decision writes the SQL of a decision for limits: whether they admit
// the request, and if they do, the row's new state and expires_at. Its
// inputs are SQL too: state, the row's state column (NULL, or known to have
// the limits' shape: see shaped), tat its expires_at in µs (NULL for a new
// key), and now the database time in µs, a column, as it is read many
// times. It computes what docs/limits.md
// defines, as evaluate does.
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
func decision(limits []Limit, mode int, state, tat, now string, params limitParams) (admits, newState, newExpires string) {
	single := len(limits) == 1 && limits[0].Algorithm == GCRA
	var caps, oks, next, expires []string
	for i, l := range limits {
		P := l.Period.Microseconds()
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
			next = append(next, fmt.Sprintf("%s + {u} * %s", a, T), "0", "0")
			expires = append(expires, fmt.Sprintf("%s + {u} * %s", a, T))
		case FixedWindow:
			if l.Calendar != "" {
				// The window's end is kept in the state: the zone's rules
				// decide it once, when the window opens.
				live := fmt.Sprintf("%s < %s", now, s(3))
				start, end := l.windowSQL(now)
				a = fmt.Sprintf("CASE WHEN %s THEN %s ELSE %s END", live, s(1), start)
				b = fmt.Sprintf("CASE WHEN %s THEN %s ELSE 0 END", live, s(2))
				e := fmt.Sprintf("CASE WHEN %s THEN %s ELSE %s END", live, s(3), end)
				capacity = fmt.Sprintf("%s - %s", R, b)
				next = append(next, a, b+" + {u}", e)
				expires = append(expires, e)
				break
			}
			live := fmt.Sprintf("%s < %s + %d", now, s(1), P)
			a = fmt.Sprintf("CASE WHEN %s THEN %s ELSE %s END", live, s(1), now)
			b = fmt.Sprintf("CASE WHEN %s THEN %s ELSE 0 END", live, s(2))
			capacity = fmt.Sprintf("%s - %s", R, b)
			next = append(next, a, b+" + {u}", "0")
			expires = append(expires, fmt.Sprintf("%s + %d", a, P))
		case SlidingWindow:
			a = fmt.Sprintf("(%s / %d * %d)", now, P, P)
			b = fmt.Sprintf("CASE %s WHEN %s THEN %s WHEN %s - %d THEN %s ELSE 0 END", s(1), a, s(2), a, P, s(3))
			c = fmt.Sprintf("CASE WHEN %s = %s THEN %s ELSE 0 END", s(1), a, s(3))
			// The previous window's count weighs by its overlap with the
			// sliding window that ends now.
			capacity = fmt.Sprintf("%s - %s - ceil((%s)::numeric * (%d - %s %% %d) / %d)::bigint", R, c, b, P, now, P, P)
			next = append(next, a, b, c+" + {u}")
			expires = append(expires, fmt.Sprintf("%s + %d", a, 2*P)) // this window's count weighs until then
		}
		caps = append(caps, capacity)
		switch mode {
		case modeReserve: // GCRA only
			oks = append(oks, fmt.Sprintf("%s + $4::bigint * %s - %s - %s <= $5::bigint", a, T, now, BT))
		case modeAtMost: // any units at all
			oks = append(oks, fmt.Sprintf("(%s) >= 1", capacity))
		default:
			oks = append(oks, fmt.Sprintf("$4::bigint <= (%s)", capacity))
		}
	}
	admits = "(" + strings.Join(oks, " AND ") + ")"
	units := "$4::bigint"
	if mode == modeAtMost {
		units = fmt.Sprintf("least($4::bigint, %s)", strings.Join(caps, ", "))
	}
	newState = "NULL::bigint[]"
	if !single {
		newState = "ARRAY[" + strings.ReplaceAll(strings.Join(next, ", "), "{u}", units) + "]"
	}
	newExpires = "greatest(" + now + ", " + strings.ReplaceAll(strings.Join(expires, ", "), "{u}", units) + ")"
	return admits, newState, newExpires
}

// scanGeneral reads a general statement's answer: whether it admitted, the
// row's state and expires_at (µs) it decided on, and the time; the rest of
// the Decision is computed from them. For Peek, which decides here, the
// first column is NULL.
func (l *limiter) scanGeneral(row pgx.Row, n, mode int, maxDelay int64) (d Decision, decided bool, err error) {
	var r struct {
		admitted      *bool
		state         []int64
		tat           *int64
		now           int64
		rates, bursts []int64
	}
	dest := []any{&r.admitted, &r.state, &r.tat, &r.now, nil}
	if l.cfg.Overrides {
		dest = append(dest, &r.rates, &r.bursts)
	}
	if err = row.Scan(dest...); err != nil {
		return Decision{}, false, noRowsAsUndecided(err)
	}
	limits, policy := l.cfg.Limits, l.policy
	if l.cfg.Overrides {
		if limits, err = effective(limits, r.rates, r.bursts); err != nil {
			return Decision{}, false, err
		}
		policy = &Policy{Namespace: policy.Namespace, Strategy: policy.Strategy, Limits: limits}
	}
	e := evaluate(limits, r.state, r.tat, r.now, int64(n), mode, maxDelay)
	if r.admitted != nil && *r.admitted != e.allowed {
		return Decision{}, false, fmt.Errorf("the database's decision (admitted %t) differs from the library's on the same state: a bug; please report it", *r.admitted)
	}
	d = Decision{
		Allowed:    e.allowed,
		Granted:    int(e.granted),
		Remaining:  int(e.remaining),
		RetryAfter: micros(e.retry),
		ResetAfter: micros(e.reset),
		Delay:      micros(e.delay),
		Limit:      limits[e.binding],
		violated:   e.violated,
		policy:     policy,
		at:         r.now,
	}
	if !e.allowed && (n == 1 || mode == modeAtMost) && mode != modeReserve {
		d.next = d.RetryAfter // the wait for one unit
	}
	if r.admitted != nil { // a decision, not a Peek: the caller sets the key
		d = l.withTicket(d, "", limits, e.anchors)
	}
	return d, true, nil
}
