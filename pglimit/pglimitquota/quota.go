package pglimitquota

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/internal/fault"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// Period is the length of a billing period.
type Period int

const (
	// Monthly periods start every month on the anchor's day, clamped to
	// the month's last day.
	Monthly Period = iota
	// Yearly periods start every year on the anchor's month and day, the
	// day clamped to the month's last day (29 February: 28 February in a
	// common year).
	Yearly
)

// months is the period's length in months.
func (p Period) months() int32 {
	if p == Yearly {
		return 12
	}
	return 1
}

// The bounds of units, credits and thresholds.
const (
	// MaxUnits bounds a cost, an allowance, a hard cap and a credit: a
	// trillion units, so that no sum of a key's counters overflows.
	MaxUnits = 1_000_000_000_000
	// MaxCredits is how many live credits a key holds at most: a Grant
	// past it is refused.
	MaxCredits = 64
	// MaxThresholds is how many thresholds a Config may list; each is a
	// share of the allowance from 0.0001 to 10.
	MaxThresholds = 16
)

// Config configures a [Quota]. Namespace is required; every other zero
// field takes its default.
type Config struct {
	// Schema holds the tables (migrations 00015 and 00017, which
	// [pglimit.Migrate] applies). Defaults to "public".
	Schema string

	// Namespace separates quotas that share the tables: a key's plan,
	// counters, credits, ids and events belong to its namespace. Same
	// rules as a key. Required.
	Namespace string

	// Period is the length of every key's billing period. Instances that
	// share a namespace must agree on it, as on every field below, or
	// each reads the key's counters by its own periods. Defaults to
	// Monthly.
	Period Period

	// Allowance is the units per period of a key that has no plan of its
	// own ([Quota.SetPlan]), from 0 to [MaxUnits]. Defaults to 0: such a
	// key spends only credits and overage.
	Allowance int64

	// HardCap is the most units per period that a key without a plan of
	// its own may be charged against its plan (allowance and overage;
	// credits come on top). 0 means Allowance: no overage. Otherwise from
	// Allowance to [MaxUnits]. Defaults to 0.
	HardCap int64

	// TimeZone is the zone (an IANA name) of a key whose plan names none.
	// Defaults to "UTC".
	TimeZone string

	// Thresholds are the shares of a key's allowance whose crossing writes
	// an event (e.g. 0.8 and 1.0), each from 0.0001 to 10 in steps of
	// 0.0001, at most [MaxThresholds]. Defaults to none.
	Thresholds []float64

	// IDRetention is how long an admitted decision id is kept
	// ([pglimit.WithID]): a retry within it replays the first decision.
	// From [pglimit.MinIDRetention] to [pglimit.MaxIDRetention]. Defaults
	// to [pglimit.DefaultIDRetention].
	IDRetention time.Duration

	// Timeout bounds each call on top of the caller's context; past it the
	// call fails with [pglimit.ErrTimeout]. Defaults to 2s.
	Timeout time.Duration
}

// Anchor is the date a key's periods start on: Day of every month for a
// Monthly quota, Day of Month every year for a Yearly one.
type Anchor struct {
	// Month is the anchor's month, for a Yearly quota (1 to 12); a
	// Monthly quota ignores it.
	Month time.Month
	// Day is the anchor's day of the month, 1 to 31, clamped to the last
	// day of shorter months.
	Day int
}

// Plan is a key's own plan, set with [Quota.SetPlan].
type Plan struct {
	// Anchor is the date the key's periods start on.
	Anchor Anchor
	// TimeZone is the key's zone (an IANA name): its periods start at
	// local midnight there. Empty means the Config's.
	TimeZone string
	// Allowance is the key's units per period, from 0 to [MaxUnits].
	Allowance int64
	// HardCap is the most units per period charged against the plan
	// (allowance and overage); 0 means Allowance: no overage. Otherwise
	// from Allowance to [MaxUnits].
	HardCap int64
}

// When says when [Quota.SetPlan] changes a key's plan.
type When int

const (
	// AtOnce puts the plan in force now. A plan with the anchor and zone
	// in force keeps the current period and its counters (a new allowance
	// or cap applies to them); one that changes either starts a period
	// now, with nothing used, which ends at the new anchor's next date.
	AtOnce When = iota
	// AtNextPeriod puts the plan in force when the current period ends,
	// replacing any plan set before for then. A key with no row yet
	// (never decided, granted or planned) takes the plan at once.
	AtNextPeriod
)

// Usage is a key's current period.
type Usage struct {
	// FromAllowance, FromCredits and Overage are the units charged this
	// period against the allowance, against credits, and past the
	// allowance; Used is their sum.
	Used, FromAllowance, FromCredits, Overage int64
	// Allowance and HardCap are the plan's in force.
	Allowance, HardCap int64
	// CreditsLeft is the units of the key's credits that have not expired
	// at Now, whatever period they were granted in.
	CreditsLeft int64
	// PeriodStart and PeriodEnd bound the period: [PeriodStart,
	// PeriodEnd).
	PeriodStart, PeriodEnd time.Time
	// Now is the database time the answer was read at.
	Now time.Time
}

// Decision is the outcome of [Quota.Allow].
type Decision struct {
	// Allowed reports whether the units were charged.
	Allowed bool
	// Replayed reports a decision of an id admitted before: the first
	// admission, as it was then; this call charged nothing.
	Replayed bool
	// Cost is the units asked for.
	Cost int64
	// FromAllowance, FromCredits and Overage split an admission's Cost;
	// zero for a refusal.
	FromAllowance, FromCredits, Overage int64
	// Usage is the key's period right after the decision.
	Usage Usage
}

// Event is a threshold a decision crossed ([Config.Thresholds]).
type Event struct {
	Key string
	// Threshold is the share of the allowance crossed.
	Threshold float64
	// PeriodStart and PeriodEnd are the period's.
	PeriodStart, PeriodEnd time.Time
	// Used is the units charged against the plan (allowance and overage)
	// right after the crossing; Allowance, the plan's then.
	Used, Allowance int64
	// CrossedAt is the database time of the decision that crossed it.
	CrossedAt time.Time
}

// Querier runs a query that returns rows: a pgx.Tx, a *pgxpool.Pool or a
// *pgx.Conn.
type Querier interface {
	// Query runs sql with args and returns its rows, as pgx's Query does.
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Quota keeps billing periods of the keys of a namespace. Its methods are
// safe for concurrent use; instances over the same tables and namespace
// share every key.
//
// # Bounds
//
// Every call returns by its context's deadline or the quota's Timeout,
// whichever comes first. A key holds one row (about 150 bytes plus 16 per
// live credit, at most [MaxCredits]), whatever its periods; an admission
// with an id one row of pglimit_quota_ids (about 180 bytes plus the id and
// 16 per credit it took from) until the cleaner (pglimitclean, whose
// default tables include it) deletes it after IDRetention; a threshold
// crossed, one event row until [Quota.TakeEvents] takes it. A key's row
// and its ids' rows stay until [Quota.Forget] deletes them (its events
// stay). Bad input ([pglimit.ErrInvalidKey],
// [pglimit.ErrInvalidCost], [pglimit.ErrInvalidConfig],
// [pglimit.ErrInvalidID]) writes nothing, nor does a refund or settle by
// id of an id not admitted ([pglimit.ErrNotAdmitted]) or already refunded
// or settled ([pglimit.ErrAlreadySettled]); each id is refunded or settled
// once.
type Quota struct {
	db         pglimit.DB
	cfg        Config
	cap        int64   // Config.HardCap resolved
	thresholds []int32 // basis points
	retention  int64   // µs
	stmts      struct {
		allow, allowID, usage, setPlan, grant, lookupID, takeEvents string
		kept, keptID                                                string // Allow's common case (quota.allow_kept)
		refund, settle                                              string // RefundID's and SettleID's
		forget                                                      string
	}
}

const (
	keysTable      = "pglimit_quota_keys"
	idsTable       = "pglimit_quota_ids"
	eventsTable    = "pglimit_quota_events"
	defaultSchema  = "public"
	defaultTimeout = 2 * time.Second
	maxAttempts    = 3
	// txClientTimeoutMargin is how much longer than Timeout AllowTx waits
	// for the server, whose lock_timeout ends the wait and keeps the
	// caller's connection, before giving up on the connection.
	txClientTimeoutMargin = time.Second
	basisPoints           = 10_000
)

// New returns a quota of cfg over db.
func New(db pglimit.DB, cfg *Config) (*Quota, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", pglimit.ErrInvalidConfig)
	}
	if cfg == nil {
		return nil, fmt.Errorf("%w: Config is nil; Namespace is required", pglimit.ErrInvalidConfig)
	}
	c := *cfg
	c.Schema = cmp.Or(c.Schema, defaultSchema)
	if err := pglimit.ValidateIdentifier(c.Schema); err != nil {
		return nil, fmt.Errorf("%w: Schema: %w", pglimit.ErrInvalidConfig, err)
	}
	if err := pglimit.ValidateKey(c.Namespace); err != nil {
		return nil, fmt.Errorf("%w: Namespace: %w", pglimit.ErrInvalidConfig, err)
	}
	if c.Period != Monthly && c.Period != Yearly {
		return nil, fmt.Errorf("%w: Period must be Monthly or Yearly, got %d", pglimit.ErrInvalidConfig, c.Period)
	}
	c.TimeZone = cmp.Or(c.TimeZone, "UTC")
	if _, err := time.LoadLocation(c.TimeZone); err != nil {
		return nil, fmt.Errorf("%w: TimeZone: %w", pglimit.ErrInvalidConfig, err)
	}
	hardCap, err := resolveCap("", c.Allowance, c.HardCap)
	if err != nil {
		return nil, err
	}
	if len(c.Thresholds) > MaxThresholds {
		return nil, fmt.Errorf("%w: Thresholds: at most %d, got %d", pglimit.ErrInvalidConfig, MaxThresholds, len(c.Thresholds))
	}
	q := &Quota{db: db, cap: hardCap}
	for i, t := range c.Thresholds {
		bp := math.Round(t * basisPoints)
		if math.IsNaN(t) || bp < 1 || bp > 10*basisPoints || math.Abs(bp-t*basisPoints) > 1e-6 {
			return nil, fmt.Errorf("%w: Thresholds[%d]: a share from 0.0001 to 10 in steps of 0.0001, got %v", pglimit.ErrInvalidConfig, i, t)
		}
		q.thresholds = append(q.thresholds, int32(bp))
	}
	c.IDRetention = cmp.Or(c.IDRetention, pglimit.DefaultIDRetention)
	if c.IDRetention < pglimit.MinIDRetention || c.IDRetention > pglimit.MaxIDRetention {
		return nil, fmt.Errorf("%w: IDRetention must be from %s to %s, got %s", pglimit.ErrInvalidConfig, pglimit.MinIDRetention, pglimit.MaxIDRetention, c.IDRetention)
	}
	if c.Timeout < 0 {
		return nil, fmt.Errorf("%w: Timeout must not be negative, got %s", pglimit.ErrInvalidConfig, c.Timeout)
	}
	c.Timeout = cmp.Or(c.Timeout, defaultTimeout)
	q.cfg, q.retention = c, c.IDRetention.Microseconds()
	args := queries.Args{
		"keys":   pgx.Identifier{c.Schema, keysTable}.Sanitize(),
		"ids":    pgx.Identifier{c.Schema, idsTable}.Sanitize(),
		"events": pgx.Identifier{c.Schema, eventsTable}.Sanitize(),
		"lock":   "FOR UPDATE",
		"id":     "",
		"th":     "$8",
		"settle": "",
	}
	// A decision without an id has statements of its own, which leave
	// out the ids table.
	q.stmts.allow = queries.Text("quota.allow", args)
	args["th"] = "$6"
	q.stmts.kept = queries.Text("quota.allow_kept", args)
	args["id"], args["th"] = "true", "$8"
	q.stmts.keptID = queries.Text("quota.allow_kept", args)
	args["th"] = "$10"
	q.stmts.allowID = queries.Text("quota.allow", args)
	q.stmts.setPlan = queries.Text("quota.set_plan", args)
	q.stmts.grant = queries.Text("quota.grant", args)
	q.stmts.lookupID = queries.Text("quota.lookup_id", args)
	q.stmts.takeEvents = queries.Text("quota.take_events", args)
	q.stmts.forget = queries.Text("quota.forget", args)
	q.stmts.refund = queries.Text("quota.refund", args)
	args["id"], args["settle"] = "", "true"
	q.stmts.settle = queries.Text("quota.allow", args)
	args["lock"] = ""
	q.stmts.usage = queries.Text("quota.usage", args)
	return q, nil
}

// resolveCap checks an allowance and a hard cap, of the struct named by
// prefix ("" or "Plan."), and returns the cap in force: the allowance
// for 0.
func resolveCap(prefix string, allowance, hardCap int64) (int64, error) {
	switch {
	case allowance < 0 || allowance > MaxUnits:
		return 0, fmt.Errorf("%w: %sAllowance must be from 0 to %d, got %d", pglimit.ErrInvalidConfig, prefix, int64(MaxUnits), allowance)
	case hardCap == 0:
		return allowance, nil
	case hardCap < allowance || hardCap > MaxUnits:
		return 0, fmt.Errorf("%w: %sHardCap must be 0 or from Allowance (%d) to %d, got %d", pglimit.ErrInvalidConfig, prefix, allowance, int64(MaxUnits), hardCap)
	}
	return hardCap, nil
}

// head is the parameters every statement starts with (quota.period).
func (q *Quota) head(key string) []any {
	return []any{q.cfg.Namespace, key, q.cfg.Period.months(), q.cfg.TimeZone, q.cfg.Allowance, q.cap}
}

// bound returns ctx bounded by the Timeout.
func (q *Quota) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, q.cfg.Timeout, pglimit.ErrTimeout)
}

// wrap adds the sentinel of err's cause; an unknown zone, which only the
// database tells, is ErrInvalidConfig.
func (q *Quota) wrap(ctx context.Context, what string, err error) error {
	if pgtx.Code(err) == "22023" {
		return fmt.Errorf("%w: %s: %w", pglimit.ErrInvalidConfig, what, err)
	}
	return fault.Wrap(ctx, "quota "+what, q.cfg.Timeout, err)
}

// Allow charges cost units to key's current period, or refuses them
// whole if they would pass its hard cap.
//
// The units come from the allowance first, then the key's unexpired
// credits, earliest expiry first, then overage while the units charged
// against the plan (allowance and overage) stay within the hard cap. A
// refusal charges and writes nothing.
//
// With an id ([pglimit.WithID]) an admission is charged once: a retry of
// the id returns the first admission, Replayed, and charges nothing; an
// id first refused is decided afresh. A cost not from 1 to [MaxUnits] is
// [pglimit.ErrInvalidCost]; an invalid key, [pglimit.ErrInvalidKey]; an
// invalid id, [pglimit.ErrInvalidID]; none writes anything.
func (q *Quota) Allow(ctx context.Context, key string, cost int64) (Decision, error) {
	return q.allow(ctx, q.db, key, cost, q.cfg.Timeout, func(ctx context.Context, sql string, params []any, scan func(pgx.Row) error) error {
		return scan(q.db.QueryRow(ctx, sql, params...))
	})
}

// AllowTx is Allow inside the caller's transaction tx; its units, id
// and threshold events count only if tx commits.
//
// tx is a pgx.Tx, or a database/sql one through pglimitsql.Tx, at READ
// COMMITTED. An id
// admitted in a transaction that rolled back was never admitted. It runs
// in a savepoint and never aborts tx; the key's row stays locked until tx
// ends, so other decisions of the key wait for it.
func (q *Quota) AllowTx(ctx context.Context, tx pglimit.DB, key string, cost int64) (Decision, error) {
	if tx == nil {
		return Decision{}, fmt.Errorf("%w: tx is nil", pglimit.ErrInvalidConfig)
	}
	// The server ends a wait past Timeout (lock_timeout), which keeps tx
	// usable; the client gives up on a silent server a second later.
	return q.allow(ctx, tx, key, cost, q.cfg.Timeout+txClientTimeoutMargin, func(ctx context.Context, sql string, params []any, scan func(pgx.Row) error) error {
		return pgtx.InSavepoint(ctx, tx, q.cfg.Timeout, sql, params, scan)
	})
}

// allow decides with run, which sends the allow statement sql with
// params, under a deadline of bound, looking ids up on db.
func (q *Quota) allow(ctx context.Context, db pglimit.DB, key string, cost int64, bound time.Duration, run func(context.Context, string, []any, func(pgx.Row) error) error) (Decision, error) {
	if err := pglimit.ValidateKey(key); err != nil {
		return Decision{}, err
	}
	if cost < 1 || cost > MaxUnits {
		return Decision{}, fmt.Errorf("%w: cost must be from 1 to %d, got %d", pglimit.ErrInvalidCost, int64(MaxUnits), cost)
	}
	var id *string
	if s, ok := pglimit.IDFrom(ctx); ok {
		if err := pglimit.ValidateID(s); err != nil {
			return Decision{}, err
		}
		id = &s
	}
	ctx, cancel := context.WithTimeoutCause(ctx, bound, pglimit.ErrTimeout)
	defer cancel()
	// The common case first (quota.allow_kept), then, if it is not
	// that, the whole decision (quota.allow).
	kept, keptParams := q.stmts.kept, []any{q.cfg.Namespace, key, q.cfg.Allowance, q.cap, cost, q.thresholds}
	sql, params := q.stmts.allow, append(q.head(key), cost, q.thresholds)
	if id != nil {
		kept, keptParams = q.stmts.keptID, []any{q.cfg.Namespace, key, q.cfg.Allowance, q.cap, cost, id, q.retention, q.thresholds}
		sql, params = q.stmts.allowID, append(q.head(key), cost, id, q.retention, q.thresholds)
	}
	for range maxAttempts {
		var d Decision
		var taken bool
		u := &d.Usage
		scan := func(row pgx.Row) error {
			return row.Scan(&d.Allowed, &taken,
				&d.FromAllowance, &d.FromCredits, &d.Overage,
				&u.FromAllowance, &u.FromCredits, &u.Overage, &u.Allowance, &u.HardCap,
				&u.CreditsLeft, &u.PeriodStart, &u.PeriodEnd, &u.Now)
		}
		err := run(ctx, kept, keptParams, scan)
		if errors.Is(err, pgx.ErrNoRows) {
			err = run(ctx, sql, params, scan)
		}
		switch {
		case err == nil && !taken:
			d.Cost, u.Used = cost, u.FromAllowance+u.FromCredits+u.Overage
			return d, nil
		case err == nil, id != nil && pgtx.Code(err) == pgtx.CodeUniqueViolation:
			// The id was taken: by a committed decision the snapshot saw,
			// or by one that committed since, which undid this statement.
			first, found, err := q.replay(ctx, db, *id)
			if err != nil || found {
				return first, err
			}
			// Deleted since (the Cleaner): decide afresh.
		case pgtx.Code(err) == pgtx.CodeUniqueViolation:
			// A concurrent first decision of the key inserted its row.
		default:
			return Decision{}, q.wrap(ctx, "allow", err)
		}
	}
	return Decision{}, q.wrap(ctx, "allow", errors.New("the key's row or the id kept changing"))
}

// replay is the first admission of id, and whether it has one.
func (q *Quota) replay(ctx context.Context, db pglimit.DB, id string) (Decision, bool, error) {
	t, found, err := q.lookup(ctx, db, id)
	return t.first, found, err
}

// Usage returns key's current period as the database reads it now,
// writing nothing. A key never decided, granted or planned answers as a
// new key would: a period anchored now, with nothing used.
func (q *Quota) Usage(ctx context.Context, key string) (Usage, error) {
	if err := pglimit.ValidateKey(key); err != nil {
		return Usage{}, err
	}
	ctx, cancel := q.bound(ctx)
	defer cancel()
	var u Usage
	err := q.db.QueryRow(ctx, q.stmts.usage, q.head(key)...).Scan(&u.FromAllowance, &u.FromCredits, &u.Overage,
		&u.Allowance, &u.HardCap, &u.CreditsLeft, &u.PeriodStart, &u.PeriodEnd, &u.Now)
	if err != nil {
		return Usage{}, q.wrap(ctx, "usage", err)
	}
	u.Used = u.FromAllowance + u.FromCredits + u.Overage
	return u, nil
}

// SetPlan sets key's plan, at once or from the next period (see [When]),
// and returns when it takes effect: now, or the current period's end.
//
// An anchor day not from 1 to 31, a month not from 1 to 12 on a Yearly
// quota (or from 0 to 12 on a Monthly one), an allowance or hard cap out
// of bounds, or a zone the database does not know is
// [pglimit.ErrInvalidConfig] and writes nothing.
func (q *Quota) SetPlan(ctx context.Context, key string, p Plan, when When) (time.Time, error) {
	if err := pglimit.ValidateKey(key); err != nil {
		return time.Time{}, err
	}
	month := p.Anchor.Month
	switch {
	case p.Anchor.Day < 1 || p.Anchor.Day > 31:
		return time.Time{}, fmt.Errorf("%w: Anchor.Day must be from 1 to 31, got %d", pglimit.ErrInvalidConfig, p.Anchor.Day)
	case q.cfg.Period == Monthly && month == 0:
		month = time.January
	case month < time.January || month > time.December:
		return time.Time{}, fmt.Errorf("%w: Anchor.Month must be from 1 to 12, got %d", pglimit.ErrInvalidConfig, month)
	}
	if q.cfg.Period == Monthly {
		month = time.January // stored as one value, so that a Monthly anchor compares by its day
	}
	if when != AtOnce && when != AtNextPeriod {
		return time.Time{}, fmt.Errorf("%w: When must be AtOnce or AtNextPeriod, got %d", pglimit.ErrInvalidConfig, when)
	}
	hardCap, err := resolveCap("Plan.", p.Allowance, p.HardCap)
	if err != nil {
		return time.Time{}, err
	}
	zone := cmp.Or(p.TimeZone, q.cfg.TimeZone)
	ctx, cancel := q.bound(ctx)
	defer cancel()
	params := append(q.head(key), int16(month), int16(p.Anchor.Day), zone, p.Allowance, hardCap, when == AtNextPeriod)
	for range maxAttempts {
		var later bool
		var from time.Time
		err := q.db.QueryRow(ctx, q.stmts.setPlan, params...).Scan(&later, &from)
		switch {
		case err == nil:
			return from, nil
		case pgtx.Code(err) != pgtx.CodeUniqueViolation:
			return time.Time{}, q.wrap(ctx, "set plan", err)
		}
	}
	return time.Time{}, q.wrap(ctx, "set plan", errors.New("the key's row kept changing"))
}

// Grant gives key a credit of units that its decisions spend while the
// database time is before expires.
//
// The expiry counts to the microsecond (finer is truncated). Credits
// are spent after the allowance and before overage, whatever the
// period. Units not from 1 to [MaxUnits], or an expiry not after the
// database time, is [pglimit.ErrInvalidCost]; a key holding [MaxCredits]
// live credits, [pglimit.ErrInvalidConfig]; neither writes anything.
func (q *Quota) Grant(ctx context.Context, key string, units int64, expires time.Time) error {
	if err := pglimit.ValidateKey(key); err != nil {
		return err
	}
	if units < 1 || units > MaxUnits {
		return fmt.Errorf("%w: credit units must be from 1 to %d, got %d", pglimit.ErrInvalidCost, int64(MaxUnits), units)
	}
	expires = expires.Truncate(time.Microsecond)
	ctx, cancel := q.bound(ctx)
	defer cancel()
	params := append(q.head(key), units, expires, int32(MaxCredits))
	for range maxAttempts {
		var ok bool
		var now time.Time
		err := q.db.QueryRow(ctx, q.stmts.grant, params...).Scan(&ok, &now)
		switch {
		case err == nil && ok:
			return nil
		case err == nil && !expires.After(now):
			return fmt.Errorf("%w: the credit expires at %s, not after the database time %s", pglimit.ErrInvalidCost, expires, now)
		case err == nil:
			return fmt.Errorf("%w: key %q holds %d live credits already", pglimit.ErrInvalidConfig, key, MaxCredits)
		case pgtx.Code(err) != pgtx.CodeUniqueViolation:
			return q.wrap(ctx, "grant", err)
		}
	}
	return q.wrap(ctx, "grant", errors.New("the key's row kept changing"))
}

// Forget deletes everything the quota keeps for key but its threshold
// events, so that the key is as one never decided, granted or planned.
//
// It deletes the key's row (plan, anchor, a plan set for the next
// period, the period's counters, credits) and the rows of its admitted
// ids: the key's next decision starts a period anchored then, on the
// Config's plan, with no credits.
//
// Its threshold events stay: they are an outbox the application has not
// read yet ([Quota.TakeEvents]); a period of the key after Forget starts
// at another instant, so its crossings write events of their own. An id
// of the key is gone with it: [Quota.RefundID] and [Quota.SettleID] of it
// are [pglimit.ErrNotAdmitted] and write nothing, and a retry of Allow
// with it decides afresh, on the fresh row.
//
// It takes the lock a decision takes on the key's row, in one statement:
// a decision of the key racing it either comes before, and is deleted
// with the rest, or after, and counts on a fresh row. It waits for a
// decision in progress, or an AllowTx of the key whose transaction has
// not ended, up to the Timeout; an admission that commits while it waits
// makes it run its statement again, until the Timeout. Forget of a key
// the quota has nothing of is no error and writes nothing, so a Forget
// whose outcome is unknown can be retried. An invalid key is
// [pglimit.ErrInvalidKey] and writes nothing. A Forget that fails
// deleted all of it or nothing, never a part: nothing, unless its outcome
// was unknown (the connection lost as it committed). It runs in a
// transaction of its own on the quota's db.
func (q *Quota) Forget(ctx context.Context, key string) error {
	if err := pglimit.ValidateKey(key); err != nil {
		return err
	}
	ctx, cancel := q.bound(ctx)
	defer cancel()
	for {
		var done bool
		if err := q.db.QueryRow(ctx, q.stmts.forget, q.cfg.Namespace, key).Scan(&done); err != nil {
			return q.wrap(ctx, "forget", err)
		}
		if done {
			return nil
		}
		// An admission of the key committed while the statement waited
		// for its row: again, on a snapshot that sees its id.
	}
}

// TakeEvents deletes and returns up to limit threshold events of the
// quota's namespace, the oldest crossings first.
//
// limit is from 1 to 10,000; the events come by crossing time, key and
// threshold. Run it
// in the transaction that handles them (db a pgx.Tx): they are gone once
// it commits and back if it rolls back, and consumers in other
// transactions skip them meanwhile (SKIP LOCKED), so that each event is
// handled by one committed transaction.
func (q *Quota) TakeEvents(ctx context.Context, db Querier, limit int) ([]Event, error) {
	if limit < 1 || limit > 10_000 {
		return nil, fmt.Errorf("%w: limit must be from 1 to 10000, got %d", pglimit.ErrInvalidConfig, limit)
	}
	ctx, cancel := q.bound(ctx)
	defer cancel()
	rows, err := db.Query(ctx, q.stmts.takeEvents, q.cfg.Namespace, limit)
	if err != nil {
		return nil, q.wrap(ctx, "take events", err)
	}
	var out []Event
	for rows.Next() {
		var e Event
		var bp int32
		if err := rows.Scan(&e.Key, &e.PeriodStart, &e.PeriodEnd, &bp, &e.Used, &e.Allowance, &e.CrossedAt); err != nil {
			rows.Close()
			return nil, q.wrap(ctx, "take events", err)
		}
		e.Threshold = float64(bp) / basisPoints
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, q.wrap(ctx, "take events", err)
	}
	// RETURNING keeps no order.
	slices.SortFunc(out, func(a, b Event) int {
		return cmp.Or(a.CrossedAt.Compare(b.CrossedAt), cmp.Compare(a.Key, b.Key), cmp.Compare(a.Threshold, b.Threshold))
	})
	return out, nil
}
