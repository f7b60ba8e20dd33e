package engine

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// Spec is a limiter as its statements read it, in plain values: what
// pglimit's Config says, which the root translates.
type Spec struct {
	Strategy    Strategy
	Schema      string // unquoted: the limiter's table's, and its tables' beside it
	Table       string // unquoted
	Limits      []LimitSpec
	Overrides   bool // per-key limits (Config.Overrides)
	AsyncCommit bool
	Shadow      bool          // Config.Shadow: AllowAll's level counts without enforcing
	IDRetention time.Duration // how long an admitted decision id is kept (AllowAll's claims)
	// Timeout is a call's bound (Config.Timeout): on a table Citus
	// distributes, the lock_timeout its function takes in a caller's
	// transaction.
	Timeout time.Duration
	// MaxPeriod is the longest a key's own GCRA burst may take to
	// replenish, in µs: the per-key limits' statements check it.
	MaxPeriod int64
}

// LimitSpec is one of a limiter's limits as its statements read it: the
// arithmetic's figures, with its name and its burst in units, which the
// per-key limits' statements read.
type LimitSpec struct {
	arith.Limit
	Name  string
	Burst int64
}

// Tables beside a limiter's own, in its schema.
const (
	// OverridesTable holds per-key limits (migrations 00008 and 00009).
	OverridesTable = "pglimit_overrides"
	// idsTable holds decision ids (migration 00013).
	idsTable = "pglimit_ids"
)

// ResetChannel is the channel every Reset notifies, with the payload
// "<lock class>:<key>" (the lock class names the table and namespace),
// on which pglimit's Invalidator listens.
const ResetChannel = "pglimit_reset"

// overrideCounts is whether the overrides row o counts now: it has not
// lapsed (SetKeyLimitsFor). A lapsed row is the same as none.
const overrideCounts = "(o.expires_at IS NULL OR o.expires_at > now())"

// The value of an extra column in a statement's admitting branches:
// asynchronous commit's setting, none, or in a caller's transaction the
// id of the one that wrote the row, for Refund (internal/queries,
// setting.*), which needs the writes to return xactReturning.
var (
	asyncCommitColumn = queries.Static("setting.async")
	noSettingColumn   = queries.Static("setting.none")
	xactColumn        = queries.Static("setting.xact")
	xactWrittenColumn = queries.Static("setting.xact_written") // key_row.allow's
	xactReturning     = queries.Static("returning.xact")
)

// arith is the limits as the decision arithmetic reads them.
func (s Spec) arith() []arith.Limit {
	out := make([]arith.Limit, len(s.Limits))
	for i, l := range s.Limits {
		out[i] = l.Limit
	}
	return out
}

// Beside is the table name in the limiter's schema, quoted.
func (s Spec) Beside(name string) string { return pgx.Identifier{s.Schema, name}.Sanitize() }

// Statements are a limiter's statements, each built once, when it is
// made: those that decide a key (and Peek's), those that act on a key
// beside deciding it, and those of decisions with an id.
type Statements struct {
	Decide
	Keys  Keys
	IDs   *IDs  // nil where ids are not supported (Range, Overrides)
	Batch Batch // zero for Range, which does not batch
}

// Decide is the statements that decide a key, each with its answer's
// shape: the fast statement of a single GCRA limit in its own transaction
// and in a caller's (whose durability is the caller's), the general ones,
// and Peek's.
type Decide struct {
	Fast, FastTx string
	General      *General // nil for Range
	Peek         string
}

// Keys is the statements that act on a key beside deciding it, on a
// table of one server.
type Keys struct {
	Reset   string
	Refund  string // "" where Refund is not supported (Range)
	Settle  string // "" where Settle is not supported (Range)
	Pause   string // "" where Pause is not supported (Range)
	Blank   string // AllowAll's blank row of a key; "" where AllowAll is not supported (Range)
	Inspect string
	Limited string // LimitedKeys'; "" where it is not supported (Range)

	// The per-key limits' (SetKeyLimits, SetKeyLimitsFor, ListKeyLimits):
	// "" without Overrides.
	SetLimits, DeleteLimits, ListLimits string
}

// IDs is a limiter's statements for decisions with an id
// (internal/queries, ids.sql): the fast statement's and the general
// statement's in each of its modes, in their own transaction and in a
// caller's, and the lookup of an id's first decision.
type IDs struct {
	Fast, FastTx       string
	General, GeneralTx [arith.Modes]string
	Lookup             string
	RefundSingle       string // RefundID's, for a single GCRA limit
	RefundGeneral      string // RefundID's, for any other set of limits
	Settle             string // SettleID's
}

// Batch is a limiter's group commit's statements (internal/batch):
// batch.allow for a single GCRA limit, which also leases, batch.general
// for any other set of limits. SQL decides a batch, skipping rows that
// concurrent decisions lock; WaitSQL decides one key, waiting for its
// row's lock; BackSQL gives a lease's tail back, "" for none.
type Batch struct {
	SQL, WaitSQL, BackSQL string
}

// Build writes the statements of a limiter of s.
//
// The strategies differ in their templates (internal/queries): Upsert's
// and NoWait's fast statement is key_row.allow, NoWait's with a bounded
// wait for the row's lock (nowait.condition) and a lock clause of its own
// in the general statement; Range's is range.allow, which has no general
// statement, and decides nothing beside Allow, Peek and Reset.
func Build(s Spec) Statements {
	table := s.Beside(s.Table)
	column := noSettingColumn
	if s.AsyncCommit {
		column = asyncCommitColumn
	}
	fast, patience, fastID, lock := "key_row.allow", "true", "upsert.allow_id", queries.Static("upsert.lock")
	switch s.Strategy {
	case NoWait:
		patience, fastID, lock = queries.Static("nowait.condition"), "nowait.allow_id", queries.Static("nowait.lock")
	case Range:
		fast, patience, fastID, lock = "range.allow", "", "", ""
	}
	txColumn := xactWrittenColumn
	if lock == "" {
		txColumn = noSettingColumn // Range, which refunds nothing
	}
	st := Statements{Decide: Decide{
		Fast:   queries.Text(fast, queries.Args{"table": table, "patience": patience, "setting": column, "returning": ""}),
		FastTx: queries.Text(fast, queries.Args{"table": table, "patience": patience, "setting": txColumn, "returning": xactReturning}),
	}}
	st.Keys.Reset = queries.Text("reset", queries.Args{"table": table, "channel": ResetChannel})
	st.Keys.Inspect = s.inspect(table)
	if lock == "" {
		st.Peek = queries.Text("range.peek", queries.Args{"table": table})
		return st
	}
	st.General, st.Peek = s.general(table, column, lock)
	if !s.Overrides {
		st.IDs = s.ids(table, fastID, column, lock)
	}
	st.Keys.Refund = s.refund(table)
	st.Keys.Settle = s.settle("settle", table, "", "true")
	st.Keys.Pause = queries.Text("pause", queries.Args{"table": table})
	st.Keys.Blank = queries.Text("hierarchy.blank", queries.Args{"table": table})
	st.Batch = s.batch(table, column)
	st.Keys.Limited = s.limited(table)
	if s.Overrides {
		overrides := s.Beside(OverridesTable)
		st.Keys.SetLimits = queries.Text("overrides.set", queries.Args{"overrides": overrides})
		st.Keys.DeleteLimits = queries.Text("overrides.delete", queries.Args{"overrides": overrides})
		st.Keys.ListLimits = queries.Text("overrides.list", queries.Args{"overrides": overrides, "counts": overrideCounts})
	}
	return st
}

// inspect is Inspect's statement of s on table: the key's row, with its
// own limits where s has Overrides.
func (s Spec) inspect(table string) string {
	args := queries.Args{"table": table, "own": "", "own_cols": "NULL::jsonb, NULL::timestamptz"}
	if s.Overrides {
		args["own"] = queries.Text("inspect.own", queries.Args{"overrides": s.Beside(OverridesTable), "counts": overrideCounts})
		args["own_cols"] = "o.limits, o.expires_at"
	}
	return queries.Text("inspect.key", args)
}

// limited is LimitedKeys' statement of s on table: the keys that would
// refuse a request of n units ($4) now, by the key's own limits where s
// has Overrides.
func (s Spec) limited(table string) string {
	sp := s.arith()
	args := queries.Args{"table": table, "state": arith.Shaped(sp, "t.state"), "own": "", "own_fields": "", "own_cols": ""}
	var params arith.Params
	if s.Overrides {
		o := s.keyLimits()
		params = o.params("x.")
		args["own"] = o.lateral(s.Beside(OverridesTable), "$1", "t.key", "own")
		args["own_fields"] = ", own.*"
		args["own_cols"] = fmt.Sprintf(", 'rates', ARRAY[%s], 'bursts', ARRAY[%s], 'unknown', p.unknown",
			prefixed("p.", o.rates), prefixed("p.", o.bursts))
	}
	admits, _, _ := arith.DecisionSQL(sp, arith.Allow, "x.state", "x.tat", "x.now", params)
	args["refuses"] = "NOT " + admits
	if s.Overrides {
		args["refuses"] = "(NOT x.ok OR NOT " + admits + ")"
	}
	return queries.Text("inspect.limited", args)
}

// General is the general statements of a limiter (general.allow, or
// overrides.allow with per-key limits), by mode: Own in the statement's
// own transaction, Tx in a caller's. They decide for any set of limits
// on the Upsert and NoWait tables.
type General struct {
	Own, Tx [arith.Modes]string
}

// general writes the general statements of s on table, whose own writes
// return column, with the lock clause lock, and Peek's. Reserve's is
// written only when every limit is GCRA: Reserve refuses other limits
// before it reaches the database.
func (s Spec) general(table, column, lock string) (g *General, peek string) {
	if s.Overrides {
		return s.overrideGeneral(table, column, lock)
	}
	g = new(General)
	sp := s.arith()
	for mode := range arith.Modes {
		if mode == arith.Reserve && !arith.AllGCRA(sp) {
			continue
		}
		admits, state, expires := arith.DecisionSQL(sp, mode, "x.state", "x.tat", "x.now", nil)
		guard, _, _ := arith.DecisionSQL(sp, mode, "c.state", "c.tat", "c.now", nil)
		stmt := func(column, returning string) string {
			return queries.Text("general.allow", queries.Args{
				"table": table, "setting": column, "returning": returning, "lock": lock, "admits": admits, "new_state": state,
				"new_expires": expires, "guard": guard, "state": arith.Shaped(sp, "t.state"),
			})
		}
		g.Own[mode], g.Tx[mode] = stmt(column, ""), stmt(xactColumn, xactReturning)
	}
	return g, queries.Text("general.peek", queries.Args{"table": table})
}

// overrideGeneral is general for a limiter whose keys may have limits of
// their own, in the overrides table beside it.
//
// The statements decide only on a row the key's limits can use (column
// ok): one that names no limit the limiter lacks, and whose rates and
// bursts pass what pglimit checks of a key's own limits. On any other
// they refuse and write nothing, and return the row's figures, from which
// the limiter reports the error. The arithmetic reads a burst cut to the
// bound even then, so that no product overflows.
func (s Spec) overrideGeneral(table, column, lock string) (*General, string) {
	o, overrides := s.keyLimits(), s.Beside(OverridesTable)
	g := new(General)
	sp := s.arith()
	for mode := range arith.Modes {
		if mode == arith.Reserve && !arith.AllGCRA(sp) {
			continue
		}
		admits, state, expires := arith.DecisionSQL(sp, mode, "x.state", "x.tat", "x.now", o.params("x."))
		guard, _, _ := arith.DecisionSQL(sp, mode, "c.state", "c.tat", "c.now", o.params("c."))
		admits, guard = "(x.ok AND "+admits+")", "(c.ok AND "+guard+")"
		// A cost past the key's capacity is refused, and n*T may then
		// overflow: the new state is computed for an admission only.
		state = "CASE WHEN " + admits + " THEN " + state + " END"
		expires = "CASE WHEN " + admits + " THEN " + expires + " END"
		stmt := func(column, returning string) string {
			return queries.Text("overrides.allow", queries.Args{
				"table": table, "setting": column, "returning": returning, "lock": lock, "admits": admits, "new_state": state,
				"new_expires": expires, "guard": guard, "state": arith.Shaped(sp, "t.state"),
				"overrides": overrides, "counts": overrideCounts, "raw": o.raw, "derived": o.derived, "limits_out": o.out("x", true),
			})
		}
		g.Own[mode], g.Tx[mode] = stmt(column, ""), stmt(xactColumn, xactReturning)
	}
	peek := queries.Text("overrides.peek", queries.Args{
		"table": table, "overrides": overrides, "counts": overrideCounts, "raw": o.raw, "derived": o.derived, "limits_out": o.out("x", true),
	})
	return g, peek
}

// keyLimitsSQL is the SQL that reads a key's own limits from the
// overrides table: raw, each limit's rate and burst (the limiter's where
// the key has none) and the names the key's row gives that the limiter
// lacks; derived, the columns the decision reads, from raw (r<i>, t<i>,
// bt<i>: rate, emission interval and burst span; ok, whether the limits
// can use the row).
type keyLimitsSQL struct {
	raw, derived  string
	rates, bursts []string // each limit's rate and burst column, unqualified
	n             int      // the number of limits
}

// keyLimits writes the SQL that reads a key's own limits of s's limits.
func (s Spec) keyLimits() keyLimitsSQL {
	var raw, derived, oks, names []string
	var o keyLimitsSQL
	maxP := s.MaxPeriod
	for i, l := range s.Limits {
		name := "'" + strings.ReplaceAll(l.Name, "'", "''") + "'"
		names = append(names, name)
		// Through numeric: the table takes 5.0 for 5.
		raw = append(raw,
			fmt.Sprintf("coalesce((o.limits -> %s ->> 'rate')::numeric::bigint, %d) AS r%d", name, l.Rate, i),
			fmt.Sprintf("coalesce((o.limits -> %s ->> 'burst')::numeric::bigint, %d) AS b%d", name, l.Burst, i))
		// T rounds up, as pglimit's Limit.emission does.
		P := l.Period
		t := fmt.Sprintf("((%d + r%d - 1) / r%d)", P, i, i)
		derived = append(derived, fmt.Sprintf("r%d, b%d, %s AS t%d, least(b%d, %d / %s) * %s AS bt%d", i, i, t, i, i, maxP, t, t, i))
		ok := fmt.Sprintf("r%d <= %d AND b%d = 0", i, P, i)
		if l.Algorithm == arith.GCRA {
			ok = fmt.Sprintf("r%d <= %d AND b%d <= %d / %s", i, P, i, maxP, t)
		}
		oks = append(oks, ok)
		o.rates = append(o.rates, fmt.Sprintf("r%d", i))
		o.bursts = append(o.bursts, fmt.Sprintf("b%d", i))
	}
	raw = append(raw, fmt.Sprintf("ARRAY(SELECT k FROM jsonb_object_keys(o.limits) AS k WHERE k <> ALL (ARRAY[%s])) AS unknown", strings.Join(names, ", ")))
	derived = append(derived, fmt.Sprintf("unknown, cardinality(unknown) = 0 AND %s AS ok", strings.Join(oks, " AND ")))
	o.raw, o.derived, o.n = strings.Join(raw, ", "), strings.Join(derived, ", "), len(s.Limits)
	return o
}

// params names the columns of the key's limits, of the row prefix; on a
// nil o, none: the limiter's own limits.
func (o *keyLimitsSQL) params(prefix string) arith.Params {
	if o == nil {
		return nil
	}
	return func(i int) (string, string, string) {
		n := strconv.Itoa(i)
		return prefix + "r" + n, prefix + "t" + n, prefix + "bt" + n
	}
}

// lateral is the LATERAL join that reads, as alias, the limits of the key
// (the SQL key) of namespace ns (SQL too) from overrides, the table.
func (o keyLimitsSQL) lateral(overrides, ns, key, alias string) string {
	return fmt.Sprintf(`
    CROSS JOIN LATERAL (SELECT %s FROM (
        SELECT %s FROM (SELECT) AS one
        LEFT JOIN %s AS o ON o.namespace = %s AND o.key = %s AND %s) AS raw) AS %s`,
		o.derived, o.raw, overrides, ns, key, overrideCounts, alias)
}

// columns lists the columns of row r that a decision reads (params), and
// ok.
func (o keyLimitsSQL) columns(r string) string {
	var cols []string
	for i := range o.n {
		cols = append(cols, fmt.Sprintf("%s.r%d, %s.t%d, %s.bt%d", r, i, r, i, r, i))
	}
	return strings.Join(append(cols, r+".ok"), ", ")
}

// out is the answer's columns of the key's limits, of row r: their rates
// and bursts (named rates and bursts), and, with unknown, the names the
// limiter lacks.
func (o keyLimitsSQL) out(r string, unknown bool) string {
	s := fmt.Sprintf("ARRAY[%s]::bigint[] AS rates, ARRAY[%s]::bigint[] AS bursts", prefixed(r+".", o.rates), prefixed(r+".", o.bursts))
	if unknown {
		s += ", " + r + ".unknown"
	}
	return s
}

// prefixed is cols, each with prefix, joined by commas.
func prefixed(prefix string, cols []string) string {
	out := make([]string, len(cols))
	for i, c := range cols {
		out[i] = prefix + c
	}
	return strings.Join(out, ", ")
}

// ids writes the statements of decisions with an id of s on table, whose
// fast statement with an id is the template fast, with the lock clause
// lock, and whose own writes return column.
func (s Spec) ids(table, fast, column, lock string) *IDs {
	ids := s.Beside(idsTable)
	st := &IDs{
		Fast:   queries.Text(fast, queries.Args{"table": table, "ids": ids, "setting": column, "returning": ""}),
		FastTx: queries.Text(fast, queries.Args{"table": table, "ids": ids, "setting": xactColumn, "returning": xactReturning}),
		Lookup: queries.Text("ids.lookup", queries.Args{"ids": ids}),
	}
	sp := s.arith()
	for mode := range arith.Modes {
		if mode == arith.Reserve && !arith.AllGCRA(sp) {
			continue
		}
		admits, state, expires := arith.DecisionSQL(sp, mode, "x.state", "x.tat", "x.now", nil)
		guard, _, _ := arith.DecisionSQL(sp, mode, "c.state", "c.tat", "c.now", nil)
		args := queries.Args{
			"table": table, "ids": ids, "lock": lock, "admits": admits, "new_state": state,
			"new_expires": expires, "guard": guard, "state": arith.Shaped(sp, "t.state"),
			"id": "$5", "retention": "$6", "mode_column": "", "mode_value": "",
		}
		if mode != arith.Allow {
			args["mode_column"], args["mode_value"] = ", mode", fmt.Sprintf(", %d", mode)
		}
		if mode == arith.Reserve { // $5 is the maximum delay
			args["id"], args["retention"] = "$6", "$7"
		}
		stmt := func(column, returning string) string {
			args["setting"], args["returning"] = column, returning
			return queries.Text("general.allow_id", args)
		}
		st.General[mode], st.GeneralTx[mode] = stmt(column, ""), stmt(xactColumn, xactReturning)
	}
	st.Settle = s.settle("settle.id", table, ids, "false")
	if arith.Single(sp) {
		st.RefundSingle = queries.Text("refund.single_id", queries.Args{"table": table, "ids": ids})
	} else {
		refundState, flags := arith.RefundSQL(sp)
		st.RefundGeneral = queries.Text("refund.general_id", queries.Args{
			"table": table, "ids": ids, "new_state": refundState, "flags": flags,
			"state_length": strconv.Itoa(3 * len(sp)), "limits": strconv.Itoa(len(sp)),
		})
	}
	return st
}

// refund is the refund statement of s on table: refund.single for a
// single GCRA limit, refund.general for others.
func (s Spec) refund(table string) string {
	sp := s.arith()
	if arith.Single(sp) {
		return queries.Text("refund.single", queries.Args{"table": table})
	}
	state, flags := arith.RefundSQL(sp)
	return queries.Text("refund.general", queries.Args{
		"table": table, "new_state": state, "flags": flags,
		"state_length": strconv.Itoa(3 * len(sp)), "limits": strconv.Itoa(len(sp)),
	})
}

// settle is the settle statement name (settle, or settle.id) of s's
// limits (their algorithms, periods and debts; the rates and bursts are
// parameters) on table, with ids the ids table and unmade the settle.tail
// placeholder.
func (s Spec) settle(name, table, ids, unmade string) string {
	sp := s.arith()
	params := func(i int) (string, string, string) {
		n := strconv.Itoa(i + 1)
		return "x.rates[" + n + "]", "x.ts[" + n + "]", "x.bts[" + n + "]"
	}
	charged, state, expires := arith.SettleSQL(sp, "x.state", "x.tat", "x.now", "$3::bigint[]", "x.back", "$5::bigint", "x.units", params)
	return queries.Text(name, queries.Args{
		"table": table, "ids": ids, "unmade": unmade, "state": arith.Shaped(sp, "o.state"),
		"charged": charged, "new_state": state, "new_expires": expires,
	})
}

// batch writes the group commit's statements of s on table, whose writes
// return column.
func (s Spec) batch(table, column string) Batch {
	patience := "true" // Upsert waits for a lock as long as Config.Timeout lets it
	if s.Strategy == NoWait {
		patience = queries.Static("nowait.condition") // set before the first lock
	}
	if s.Overrides || !arith.Single(s.arith()) { // per-key limits among them
		return Batch{SQL: s.generalBatch(table, column, "", "true"), WaitSQL: s.generalBatch(table, column, "true", patience)}
	}
	return Batch{
		SQL:     queries.Text("batch.allow", queries.Args{"table": table, "setting": column, "wait": "", "patience": "true"}),
		WaitSQL: queries.Text("batch.allow", queries.Args{"table": table, "setting": column, "wait": "true", "patience": patience}),
		BackSQL: queries.Text("batch.give_back", queries.Args{"table": table}),
	}
}

// generalBatch writes batch.general, the batch statement of any set of
// limits, for s's limits on table: wait and patience as batch.allow's.
func (s Spec) generalBatch(table, column, wait, patience string) string {
	sp := s.arith()
	var own *keyLimitsSQL // nil: the limiter's own limits
	args := queries.Args{
		"table": table, "setting": column, "wait": wait, "patience": patience,
		"state": arith.Shaped(sp, "t.state"), "width": strconv.Itoa(3 * len(sp)),
		"own": "", "own_cols": "", "own_d": "", "own_c": "", "own_agg": "",
	}
	if s.Overrides {
		o := s.keyLimits()
		own = &o
		args["own"] = o.lateral(s.Beside(OverridesTable), "$1", "r.key", "own")
		args["own_cols"] = ", " + o.columns("c")
		args["own_d"] = ", " + o.out("d", false)
		args["own_c"] = ", " + o.out("c", false)
		args["own_agg"] = ", array_agg(rates), array_agg(bursts)"
	}
	count, _, state, expires := arith.BatchSQL(sp, "x.state", "x.tat", "x.now", "x.n", "x.calls", "g.granted", own.params("x."))
	_, guard, _, _ := arith.BatchSQL(sp, "c.state", "c.tat", "c.now", "c.n", "1", "1", own.params("c."))
	refuses := "NOT " + guard
	if s.Overrides {
		// A row the limits cannot use decides nothing: no call fits it,
		// and it is no refusal either.
		count = "CASE WHEN x.ok THEN " + count + " ELSE 0 END"
		guard, refuses = "(c.ok AND "+guard+")", "(c.ok AND "+refuses+")"
	}
	args["guard"], args["refuses"], args["count"], args["new_state"], args["new_expires"] = guard, refuses, count, state, expires
	return queries.Text("batch.general", args)
}

// The functions pglimit.Distribute installs for a table are named as the
// table with a suffix.
const (
	AllowSuffix  = "_allow"
	DecideSuffix = "_decide"
	PeekSuffix   = "_peek"
)

// Citus writes the statements of a limiter of s that decide a key
// on a table Citus distributes: calls of its functions, with the same
// parameters and answers as Build's. A call in a caller's transaction
// passes s.Timeout as the function's lock_timeout.
func Citus(s Spec) Decide {
	fn := func(suffix string) string { return s.Beside(s.Table + suffix) }
	ms := (s.Timeout + time.Millisecond - 1) / time.Millisecond // rounded up: 0 would disable it
	inTx := fmt.Sprintf("false, '%dms'", ms)
	own := fmt.Sprintf("%t, NULL", s.AsyncCommit)
	call := func(name, suffix string, args queries.Args) (plain, tx string) {
		args["function"] = fn(suffix)
		args["tail"] = own
		plain = queries.Text(name, args)
		args["tail"] = inTx
		return plain, queries.Text(name, args)
	}
	peek := queries.Text("citus.call.peek", queries.Args{"function": fn(PeekSuffix)})
	if s.Strategy == Range {
		fast, fastTx := call("citus.call.range_allow", AllowSuffix, queries.Args{})
		return Decide{Fast: fast, FastTx: fastTx, Peek: peek}
	}
	nowait := strconv.FormatBool(s.Strategy == NoWait)
	g := new(General)
	for mode := range arith.Modes {
		maxDelay := "0"
		if mode == arith.Reserve {
			maxDelay = "$5"
		}
		g.Own[mode], g.Tx[mode] = call("citus.call.decide", DecideSuffix, queries.Args{
			"mode": strconv.Itoa(int(mode)), "max_delay": maxDelay, "spec": s.specArray(), "nowait": nowait,
		})
	}
	fast, fastTx := call("citus.call.row_allow", AllowSuffix, queries.Args{"nowait": nowait})
	return Decide{Fast: fast, FastTx: fastTx, General: g, Peek: peek}
}

// specArray is s's limits as the migrations' pglimit_decide reads them,
// an array literal of validated integers: algorithm, period (µs), rate
// and burst per limit.
func (s Spec) specArray() string {
	parts := make([]string, 0, 4*len(s.Limits))
	for _, l := range s.Limits {
		parts = append(parts, strconv.Itoa(int(l.Algorithm)), strconv.FormatInt(l.Period, 10), strconv.FormatInt(l.Rate, 10), strconv.FormatInt(l.Burst, 10))
	}
	return "ARRAY[" + strings.Join(parts, ", ") + "]::bigint[]"
}

// Hierarchy writes AllowAll's statement (hierarchy.allow) for the limiters
// of levels (in lock order), in a caller's transaction or its own, with a
// decision id or without: its parameters are each level's namespace and
// key, then n, then the id.
func Hierarchy(levels []Spec, inTx, id bool) string {
	var snapshot, seen, ownSeen, fits, locks, values, own, decisions, updates, answer, seenAnswer, counted, writes, written, claims []string
	async := true
	nParam := "$" + strconv.Itoa(2*len(levels)+1) + "::bigint"
	claimed, taken, notTaken := "", "", ""
	if id {
		claimed, taken, notTaken = " AND EXISTS (SELECT FROM c0)", ", d.go AND NOT EXISTS (SELECT FROM c0)", ", false"
	}
	for i, lv := range levels {
		is := strconv.Itoa(i)
		ns, key := "$"+strconv.Itoa(2*i+1), "$"+strconv.Itoa(2*i+2)
		sp, table := lv.arith(), lv.Beside(lv.Table)
		snapshot = append(snapshot, queries.Text("hierarchy.snapshot", queries.Args{"i": is, "table": table, "ns": ns, "key": key}))
		seen = append(seen, queries.Text("hierarchy.seen", queries.Args{"i": is, "state": arith.Shaped(sp, "r"+is+".state")}))
		after := ""
		if i > 0 {
			after = "(SELECT count(*) FROM l" + strconv.Itoa(i-1) + ") >= 0 AND "
		}
		locks = append(locks, queries.Text("hierarchy.lock", queries.Args{"i": is, "table": table, "ns": ns, "key": key, "after": after}))
		values = append(values, queries.Text("hierarchy.values", queries.Args{"i": is, "state": arith.Shaped(sp, "l.state")}))
		columns := fmt.Sprintf("%%[1]s.f%[1]s, %%[1]s.s%[1]s, %%[1]s.tat%[1]s", is)
		var params arith.Params
		ok := "true"
		if lv.Overrides {
			o := lv.keyLimits()
			alias := "o" + is
			own = append(own, o.lateral(lv.Beside(OverridesTable), ns, key, alias))
			params, ok = o.params(alias+"."), alias+".ok"
			limits := fmt.Sprintf("ARRAY[%s]::bigint[] AS rates%s, ARRAY[%s]::bigint[] AS bursts%s, %s.unknown AS unknown%s",
				prefixed(alias+".", o.rates), is, prefixed(alias+".", o.bursts), is, alias, is)
			decisions, ownSeen = append(decisions, limits), append(ownSeen, ", "+limits)
			columns += fmt.Sprintf(", %%[1]s.rates%[1]s, %%[1]s.bursts%[1]s, %%[1]s.unknown%[1]s", is)
		}
		answer, seenAnswer = append(answer, fmt.Sprintf(columns, "d")), append(seenAnswer, fmt.Sprintf(columns, "g"))
		// The level's decision, as its limiter's general statement makes
		// it, with n as a parameter of this statement: on the snapshot's
		// row (g), and on the locked one (x).
		admits := func(row string) string {
			a, _, _ := arith.DecisionSQL(sp, arith.Allow, row+".s"+is, row+".tat"+is, row+".now", params)
			return "(" + ok + " AND " + strings.ReplaceAll(a, "$4::bigint", nParam) + ")"
		}
		if !lv.Shadow {
			fits = append(fits, admits("g"))
		}
		_, state, expires := arith.DecisionSQL(sp, arith.Allow, "x.s"+is, "x.tat"+is, "x.now", params)
		a := admits("x")
		state = "CASE WHEN " + a + " THEN " + strings.ReplaceAll(state, "$4::bigint", nParam) + " END"
		expires = "CASE WHEN " + a + " THEN " + strings.ReplaceAll(expires, "$4::bigint", nParam) + " END"
		decisions = append(decisions, fmt.Sprintf("%s AS a%s, %s AS ns%s, %s AS ne%s", a, is, state, is, expires, is))
		found := "x.f" + is + " = 1"
		if lv.Shadow {
			counted = append(counted, found)
		} else {
			counted = append(counted, found+" AND "+a)
		}
		returning := ""
		if inTx {
			returning = xactReturning
			writes = append(writes, "SELECT xmin FROM u"+is)
		}
		updates = append(updates, queries.Text("hierarchy.update", queries.Args{"i": is, "table": table, "ns": ns, "key": key, "returning": returning, "claimed": claimed}))
		if id {
			conflict, after := "ON CONFLICT (namespace, id) DO NOTHING\n    ", claimed
			if i == 0 {
				after = ""
			} else {
				conflict = ""
			}
			claims = append(claims, queries.Text("hierarchy.claim", queries.Args{
				"i": is, "ids": lv.Beside(idsTable), "ns": ns, "key": key,
				"id": "$" + strconv.Itoa(2*len(levels)+2), "n": nParam, "retention": strconv.FormatInt(lv.IDRetention.Microseconds(), 10),
				"conflict": conflict, "after": after,
			})+", ")
		}
		written = append(written, "(SELECT count(*) FROM u"+is+")")
		async = async && lv.AsyncCommit
	}
	setting := noSettingColumn
	switch {
	case inTx: // the subtransaction that wrote the rows, for Refund
		setting = queries.Text("hierarchy.xact", queries.Args{"writes": strings.Join(writes, " UNION ALL ")})
	case async:
		setting = asyncCommitColumn
	}
	return queries.Text("hierarchy.allow", queries.Args{
		"snapshot": strings.Join(snapshot, "\n    "), "seen": strings.Join(seen, ",\n        "),
		"own_seen": strings.Join(ownSeen, ""), "fits": "(" + strings.Join(append(fits, "true"), " AND ") + ")",
		"locks": strings.Join(locks, ", "), "last": "l" + strconv.Itoa(len(levels)-1),
		"values": strings.Join(values, ",\n        "), "own": strings.Join(own, ""),
		"decisions": strings.Join(decisions, ",\n        "), "go": "(" + strings.Join(counted, ") AND (") + ")",
		"updates": strings.Join(updates, ", "), "answer": strings.Join(answer, ", "), "seen_answer": strings.Join(seenAnswer, ", "),
		"setting": setting, "written": "(" + strings.Join(written, " + ") + ")",
		"claims": strings.Join(claims, ""), "taken": taken, "not_taken": notTaken,
	})
}
