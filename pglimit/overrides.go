package pglimit

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// overridesTable holds per-key limits (migrations 00008 and 00009).
const overridesTable = "pglimit_overrides"

// overrideCounts is whether the overrides row o counts now: it has not
// lapsed (SetKeyLimitsFor). A lapsed row is the same as none.
const overrideCounts = "(o.expires_at IS NULL OR o.expires_at > now())"

// newOverrideStatements is newGeneralStatements for a limiter whose keys
// may have limits of their own, in overrides, a table in the same schema.
//
// The statements decide only on a row the key's limits can use (column
// ok): one that names no limit the limiter lacks, and whose rates and
// bursts pass what Limit.withKeyLimits checks. On any other they refuse
// and write nothing, and return the row's figures, from which the limiter
// reports the error. The arithmetic reads a burst cut to the bound even
// then, so that no product overflows.
func newOverrideStatements(limits []Limit, table, overrides, column, lock string) generalStatements {
	o := newOverrideSQL(limits)
	var g generalStatements
	sp := specs(limits)
	for mode := range modes {
		if mode == modeReserve && !arith.AllGCRA(sp) {
			continue
		}
		admits, state, expires := arith.DecisionSQL(sp, arith.Mode(mode), "x.state", "x.tat", "x.now", o.params("x."))
		guard, _, _ := arith.DecisionSQL(sp, arith.Mode(mode), "c.state", "c.tat", "c.now", o.params("c."))
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
		g.own[mode], g.tx[mode] = stmt(column, ""), stmt(xactColumn, xactReturning)
	}
	g.peek = queries.Text("overrides.peek", queries.Args{
		"table": table, "overrides": overrides, "counts": overrideCounts, "raw": o.raw, "derived": o.derived, "limits_out": o.out("x", true),
	})
	return g
}

// overrideSQL is the SQL that reads a key's own limits from the overrides
// table: raw, each limit's rate and burst (the limiter's where the key has
// none) and the names the key's row gives that the limiter lacks; derived,
// the columns the decision reads, from raw (r<i>, t<i>, bt<i>: rate,
// emission interval and burst span; ok, whether the limits can use the
// row).
type overrideSQL struct {
	raw, derived  string
	rates, bursts []string // each limit's rate and burst column, unqualified
	n             int      // the number of limits
}

// newOverrideSQL writes the SQL that reads a key's own limits of limits.
func newOverrideSQL(limits []Limit) overrideSQL {
	var raw, derived, oks, names []string
	var o overrideSQL
	maxP := maxPeriod.Microseconds()
	for i, l := range limits {
		name := "'" + strings.ReplaceAll(l.Name, "'", "''") + "'"
		names = append(names, name)
		// Through numeric: the table takes 5.0 for 5.
		raw = append(raw,
			fmt.Sprintf("coalesce((o.limits -> %s ->> 'rate')::numeric::bigint, %d) AS r%d", name, l.Rate, i),
			fmt.Sprintf("coalesce((o.limits -> %s ->> 'burst')::numeric::bigint, %d) AS b%d", name, l.Burst, i))
		// T rounds up, as Limit.emission does.
		P := l.Period.Microseconds()
		t := fmt.Sprintf("((%d + r%d - 1) / r%d)", P, i, i)
		derived = append(derived, fmt.Sprintf("r%d, b%d, %s AS t%d, least(b%d, %d / %s) * %s AS bt%d", i, i, t, i, i, maxP, t, t, i))
		ok := fmt.Sprintf("r%d <= %d AND b%d = 0", i, P, i)
		if l.Algorithm == GCRA {
			ok = fmt.Sprintf("r%d <= %d AND b%d <= %d / %s", i, P, i, maxP, t)
		}
		oks = append(oks, ok)
		o.rates = append(o.rates, fmt.Sprintf("r%d", i))
		o.bursts = append(o.bursts, fmt.Sprintf("b%d", i))
	}
	raw = append(raw, fmt.Sprintf("ARRAY(SELECT k FROM jsonb_object_keys(o.limits) AS k WHERE k <> ALL (ARRAY[%s])) AS unknown", strings.Join(names, ", ")))
	derived = append(derived, fmt.Sprintf("unknown, cardinality(unknown) = 0 AND %s AS ok", strings.Join(oks, " AND ")))
	o.raw, o.derived, o.n = strings.Join(raw, ", "), strings.Join(derived, ", "), len(limits)
	return o
}

// params names the columns of the key's limits, of the row prefix; on a
// nil o, none: the limiter's own limits.
func (o *overrideSQL) params(prefix string) arith.Params {
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
func (o overrideSQL) lateral(overrides, ns, key, alias string) string {
	return fmt.Sprintf(`
    CROSS JOIN LATERAL (SELECT %s FROM (
        SELECT %s FROM (SELECT) AS one
        LEFT JOIN %s AS o ON o.namespace = %s AND o.key = %s AND %s) AS raw) AS %s`,
		o.derived, o.raw, overrides, ns, key, overrideCounts, alias)
}

// columns lists the columns of row r that a decision reads (params), and
// ok.
func (o overrideSQL) columns(r string) string {
	var cols []string
	for i := range o.n {
		cols = append(cols, fmt.Sprintf("%s.r%d, %s.t%d, %s.bt%d", r, i, r, i, r, i))
	}
	return strings.Join(append(cols, r+".ok"), ", ")
}

// out is the answer's columns of the key's limits, of row r: their rates
// and bursts (named rates and bursts), and, with unknown, the names the
// limiter lacks.
func (o overrideSQL) out(r string, unknown bool) string {
	s := fmt.Sprintf("ARRAY[%s]::bigint[] AS rates, ARRAY[%s]::bigint[] AS bursts", prefixed(r+".", o.rates), prefixed(r+".", o.bursts))
	if unknown {
		s += ", " + r + ".unknown"
	}
	return s
}

// keyLimits returns limits with the rates and bursts a statement read for
// the key, as it returned them: the key's own limits. A row the limits
// cannot use, on which the statement decided nothing, is ErrInvalidConfig.
func keyLimits(limits []Limit, rates, bursts []int64, unknown []string) ([]Limit, error) {
	if len(rates) != len(limits) || len(bursts) != len(limits) {
		return nil, fmt.Errorf("the statement returned %d rates and %d bursts for %d limits", len(rates), len(bursts), len(limits))
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("%w: the key's row in %s names %q, which the limiter does not have", ErrInvalidConfig, overridesTable, unknown)
	}
	out := make([]Limit, len(limits))
	for i, l := range limits {
		var err error
		if out[i], err = l.withKeyLimits(rates[i], bursts[i]); err != nil {
			return nil, fmt.Errorf("the key's row in %s: %w", overridesTable, err)
		}
	}
	return out, nil
}

// withKeyLimits returns l with a key's own rate and burst (a burst of 0
// for a window), checked as a limit of the limiter's own is: at most one
// unit per microsecond, and a GCRA burst that replenishes within 366 days.
// The override statements check the same (newOverrideStatements).
func (l Limit) withKeyLimits(rate, burst int64) (Limit, error) {
	switch {
	case rate < 1 || rate > maxRate:
		return l, fmt.Errorf("%w: limit %q: rate %d, not in [1, %d]", ErrInvalidConfig, l.Name, rate, maxRate)
	case rate > l.Period.Microseconds():
		return l, fmt.Errorf("%w: limit %q: %d per %s is more than one per microsecond", ErrInvalidConfig, l.Name, rate, l.Period)
	case l.Algorithm != GCRA && burst != 0:
		return l, fmt.Errorf("%w: limit %q: a burst of %d, but %s takes none", ErrInvalidConfig, l.Name, burst, l.Algorithm)
	case l.Algorithm == GCRA && (burst < 1 || burst > maxRate):
		return l, fmt.Errorf("%w: limit %q: burst %d, not in [1, %d]", ErrInvalidConfig, l.Name, burst, maxRate)
	}
	l.Rate, l.Burst = int(rate), int(burst)
	if l.Algorithm == GCRA && burst > maxPeriod.Microseconds()/l.emission() {
		return l, fmt.Errorf("%w: limit %q: a burst of %d at %d per %s takes more than %s to replenish", ErrInvalidConfig, l.Name, burst, rate, l.Period, maxPeriod)
	}
	return l, nil
}

// costFits reports, as ErrInvalidCost, n units that limits could never
// admit at once in mode (within maxDelay µs, for Reserve). AllowAtMost
// takes any n.
func costFits(limits []Limit, n, mode int, maxDelay int64) error {
	for _, l := range limits {
		switch {
		case mode == modeReserve && int64(n) > (int64(l.Burst)*l.emission()+maxDelay)/l.emission():
			return fmt.Errorf("%w: n = %d never fits limit %q within %s", ErrInvalidCost, n, l.Name, micros(maxDelay))
		case mode == modeAllow && n > l.capacity():
			return fmt.Errorf("%w: n = %d is more than limit %q admits at once (%d)", ErrInvalidCost, n, l.Name, l.capacity())
		}
	}
	return nil
}

// SetKeyLimits gives key its own rates and bursts for some of lim's
// limits, for good, or, given no limits, takes them away.
//
// lim's Config sets [Config.Overrides]. Each of limits names one of lim's
// by Name and gives its Rate, its Burst, or both; its other fields must
// be zero, as a key's limit differs from the limiter's in rate and burst
// only. The next decision on the key, on every instance, uses them; the key keeps what it has consumed (docs/limits.md). The same
// can be done with plain SQL on pglimit_overrides. A limit name the
// configuration does not have, or a rate or burst it would refuse (such as a
// GCRA burst that takes more than 366 days to replenish at the key's rate),
// is [ErrInvalidConfig], and nothing is written. Like a decision, it waits
// at most [Config.Timeout] ([ErrTimeout]) and needs a server that can write
// ([ErrReadOnly]).
func SetKeyLimits(ctx context.Context, lim Limiter, key string, limits ...Limit) error {
	return setKeyLimits(ctx, lim, OpSetKeyLimits, key, 0, limits)
}

// SetKeyLimitsFor is SetKeyLimits for ttl: the key's own limits lapse ttl
// after they are written.
//
// ttl runs on the database clock; when it ends the key is back on the
// limiter's limits, keeping what it consumed meanwhile. A ttl that is
// not positive, or is longer than 366 days, is [ErrInvalidConfig].
func SetKeyLimitsFor(ctx context.Context, lim Limiter, key string, ttl time.Duration, limits ...Limit) error {
	return setKeyLimits(ctx, lim, OpSetKeyLimitsFor, key, ttl, limits)
}

// setKeyLimits is SetKeyLimits (op OpSetKeyLimits, ttl 0) and
// SetKeyLimitsFor, observed.
func setKeyLimits(ctx context.Context, lim Limiter, op Op, key string, ttl time.Duration, limits []Limit) error {
	l, err := made(lim, string(op))
	if err != nil {
		return err
	}
	_, err = l.observe(ctx, op, key, "", 0, func(ctx context.Context) (Decision, error) {
		if op == OpSetKeyLimits {
			return Decision{}, l.setKeyLimits(ctx, key, nil, limits)
		}
		if ttl <= 0 || ttl > maxPeriod {
			return Decision{}, fmt.Errorf("%w: SetKeyLimitsFor: ttl %s, not in (0, %s]", ErrInvalidConfig, ttl, maxPeriod)
		}
		if len(limits) == 0 {
			return Decision{}, fmt.Errorf("%w: SetKeyLimitsFor: no limits; SetKeyLimits with none takes a key's away", ErrInvalidConfig)
		}
		us := ttl.Microseconds()
		return Decision{}, l.setKeyLimits(ctx, key, &us, limits)
	})
	return err
}

// setKeyLimits writes key's own limits, lapsing after ttl µs (nil:
// never), or deletes them when there are none: SetKeyLimits and
// SetKeyLimitsFor unobserved.
func (l *limiter) setKeyLimits(ctx context.Context, key string, ttl *int64, limits []Limit) error {
	db, c := l.db, l.cfg
	table, err := overridesOf(c, "SetKeyLimits")
	if err != nil {
		return err
	}
	if err := ValidateKey(key); err != nil {
		return err
	}
	sql, args := queries.Text("overrides.delete", queries.Args{"overrides": table}), []any{c.Namespace, key}
	if len(limits) > 0 {
		doc, err := keyLimitsDoc(c.Limits, limits)
		if err != nil {
			return err
		}
		sql, args = queries.Text("overrides.set", queries.Args{"overrides": table}), append(args, doc, ttl)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, c.Timeout, ErrTimeout)
	defer cancel()
	if _, err = db.Exec(ctx, sql, args...); err != nil {
		return statementErr(ctx, db, c, table, nil, "SetKeyLimits", err)
	}
	return nil
}

// overridesOf is c's overrides table, quoted, which c must set; op names
// the caller in errors.
func overridesOf(c Config, op string) (string, error) {
	if !c.Overrides {
		return "", fmt.Errorf("%w: %s: the configuration does not set Overrides", ErrInvalidConfig, op)
	}
	return pgx.Identifier{c.Schema, overridesTable}.Sanitize(), nil
}

// KeyLimits is a key's own limits, as [SetKeyLimits] wrote them.
type KeyLimits struct {
	Key string
	// Limits are the limits the key has its own rate or burst for: Name,
	// and the Rate and Burst the key's row gives (zero where it gives
	// none, and the limiter's counts).
	Limits []Limit
	// Expires is when they lapse, on the database clock; zero if never.
	Expires time.Time
	// Updated is when they were last written.
	Updated time.Time
}

// ListKeyLimits returns a page of the keys of lim's namespace that have
// their own limits now.
//
// Lapsed limits are left out. The keys come in key order, starting after
// the key after ("" for the first page), at most max (1 to 1000) of them.
// It is one statement, bounded by [Config.Timeout].
func ListKeyLimits(ctx context.Context, lim Limiter, after string, max int) (page []KeyLimits, err error) {
	l, err := made(lim, "ListKeyLimits")
	if err != nil {
		return nil, err
	}
	_, err = l.observe(ctx, OpListKeyLimits, "", "", 0, func(ctx context.Context) (Decision, error) {
		var err error
		page, err = l.listKeyLimits(ctx, after, max)
		return Decision{}, err
	})
	return page, err
}

// listKeyLimits is ListKeyLimits unobserved.
func (l *limiter) listKeyLimits(ctx context.Context, after string, max int) ([]KeyLimits, error) {
	db, c := l.db, l.cfg
	table, err := overridesOf(c, "ListKeyLimits")
	if err != nil {
		return nil, err
	}
	if max < 1 || max > maxPage {
		return nil, fmt.Errorf("%w: ListKeyLimits: max %d, not in [1, %d]", ErrInvalidConfig, max, maxPage)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, c.Timeout, ErrTimeout)
	defer cancel()
	sql := queries.Text("overrides.list", queries.Args{"overrides": table, "counts": overrideCounts})
	var page []struct {
		Key     string      `json:"key"`
		Limits  overrideDoc `json:"limits"`
		Expires *time.Time  `json:"expires"`
		Updated time.Time   `json:"updated"`
	}
	if err := db.QueryRow(ctx, sql, c.Namespace, after, max).Scan(&page); err != nil {
		return nil, statementErr(ctx, db, c, table, nil, "ListKeyLimits", err)
	}
	out := make([]KeyLimits, len(page))
	for i, p := range page {
		out[i] = KeyLimits{Key: p.Key, Limits: docLimits(p.Limits), Updated: p.Updated}
		if p.Expires != nil {
			out[i].Expires = *p.Expires
		}
	}
	return out, nil
}

// maxPage is the most rows a listing returns at once.
const maxPage = 1000

// overrideDoc is a row of pglimit_overrides' limits: by limit name, its
// rate and burst. Numbers, not integers: the table takes 5.0 for 5 (its
// CHECK holds them to whole numbers up to 2^30, exact in a float64).
type overrideDoc map[string]map[string]float64

// docLimits is the limits of a row of pglimit_overrides, by name.
func docLimits(doc overrideDoc) []Limit {
	var out []Limit
	for _, name := range slices.Sorted(maps.Keys(doc)) {
		out = append(out, Limit{Name: name, Rate: int(doc[name]["rate"]), Burst: int(doc[name]["burst"])})
	}
	return out
}

// keyLimitsDoc validates a key's limits against the limiter's, and
// returns them as the JSON of a row of pglimit_overrides.
func keyLimitsDoc(limits, keys []Limit) (string, error) {
	doc := map[string]map[string]int{}
	for i, kl := range keys {
		j := slices.IndexFunc(limits, func(l Limit) bool { return l.Name == kl.Name })
		if j < 0 {
			return "", fmt.Errorf("%w: SetKeyLimits: limits[%d]: the limiter has no limit named %q", ErrInvalidConfig, i, kl.Name)
		}
		if _, dup := doc[kl.Name]; dup {
			return "", fmt.Errorf("%w: SetKeyLimits: limits[%d]: %q is given twice", ErrInvalidConfig, i, kl.Name)
		}
		l := limits[j]
		switch {
		case kl.Period != 0 || kl.Algorithm != GCRA || kl.Calendar != "" || kl.TimeZone != "":
			return "", fmt.Errorf("%w: SetKeyLimits: limits[%d]: only Name, Rate and Burst may be set", ErrInvalidConfig, i)
		case kl.Rate < 0 || kl.Burst < 0 || (kl.Burst > 0 && l.Algorithm != GCRA) || kl.Rate == 0 && kl.Burst == 0:
			return "", fmt.Errorf("%w: SetKeyLimits: limits[%d]: rate %d, burst %d", ErrInvalidConfig, i, kl.Rate, kl.Burst)
		}
		if _, err := l.withKeyLimits(int64(cmp.Or(kl.Rate, l.Rate)), int64(cmp.Or(kl.Burst, l.Burst))); err != nil {
			return "", fmt.Errorf("SetKeyLimits: limits[%d]: %w", i, err)
		}
		fields := map[string]int{}
		if kl.Rate > 0 {
			fields["rate"] = kl.Rate
		}
		if kl.Burst > 0 {
			fields["burst"] = kl.Burst
		}
		doc[kl.Name] = fields
	}
	js, err := json.Marshal(doc)
	return string(js), err
}
