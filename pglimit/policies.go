package pglimit

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit/internal/fault"
	"github.com/pglimit/cooldown/pglimit/internal/pgtx"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// policiesTable is where each limiter records its policy (migration
// 00011), in its Config.Schema.
const policiesTable = "pglimit_policies"

// RecordedPolicy is a limiter's policy as the limiter recorded it in the
// database, for those who hold no [Config]: the operator command, the
// person on call who reads a 429.
//
// A limiter over a pool records its policy once, at its first decision,
// in the pglimit_policies table of its schema (migration 00011): one row per
// table and namespace, holding the latest policy recorded and the one
// recorded before it, when that differed. Both run during a rolling deploy
// that changes a namespace's limits; the latest is the one whose limiter
// started last. docs/operations.md says more.
type RecordedPolicy struct {
	// Table is the limiter's Config.Table.
	Table string
	// Policy is its namespace, strategy and limits, defaults filled in,
	// in its order.
	Policy
	// Overrides is its Config.Overrides.
	Overrides bool
	// Recorded is when a limiter of this policy last recorded it, on the
	// database clock (at most once a minute).
	Recorded time.Time
	// Latest is whether it is the latest recorded for its table and
	// namespace; false for the one before it, which differs from it.
	Latest bool
}

// RecordedPolicies returns every policy the limiters of schema ("" means
// "public") recorded, each namespace's latest first. It is one statement,
// bounded by the default [Config.Timeout], which reads one row per
// namespace. In a schema that lacks the table (one migrated before
// migration 00011, or a misspelt one) it fails with [ErrInvalidConfig]
// saying so.
func RecordedPolicies(ctx context.Context, db DB, schema string) ([]RecordedPolicy, error) {
	schema = cmp.Or(schema, defaultSchema)
	if err := ValidateIdentifier(schema); err != nil {
		return nil, fmt.Errorf("%w: Schema: %w", ErrInvalidConfig, err)
	}
	table := pgx.Identifier{schema, policiesTable}.Sanitize()
	ctx, cancel := context.WithTimeoutCause(ctx, defaultTimeout, ErrTimeout)
	defer cancel()
	var rows []struct {
		Table      string     `json:"table"`
		Namespace  string     `json:"namespace"`
		Policy     policyDoc  `json:"policy"`
		Recorded   time.Time  `json:"recorded_at"`
		Previous   *policyDoc `json:"previous"`
		PrevRecord *time.Time `json:"previous_recorded_at"`
	}
	err := db.QueryRow(ctx, queries.Text("policies.list", queries.Args{"policies": table})).Scan(&rows)
	if pgtx.Code(err) == pgtx.CodeUndefinedTable {
		return nil, fmt.Errorf("%w: RecordedPolicies: table %s does not exist: schema %q is misspelt, or was migrated before limiters recorded their policies (apply the migrations: pglimit.Migrate)",
			ErrInvalidConfig, table, schema)
	}
	if err != nil {
		return nil, fault.Wrap(ctx, "RecordedPolicies", defaultTimeout, err)
	}
	var out []RecordedPolicy
	for _, r := range rows {
		out = append(out, r.Policy.recorded(r.Table, r.Namespace, r.Recorded, true))
		if r.Previous != nil && r.PrevRecord != nil {
			out = append(out, r.Previous.recorded(r.Table, r.Namespace, *r.PrevRecord, false))
		}
	}
	return out, nil
}

// policyDoc is a policy as pglimit_policies holds it (migration 00011).
type policyDoc struct {
	Strategy  Strategy   `json:"strategy"`
	Overrides bool       `json:"overrides"`
	Limits    []limitDoc `json:"limits"`
}

// limitDoc is a Limit as pglimit_policies holds it: its period in µs.
type limitDoc struct {
	Name      string `json:"name"`
	Rate      int    `json:"rate"`
	PeriodUS  int64  `json:"period_us,omitempty"`
	Burst     int    `json:"burst,omitempty"`
	Debt      int    `json:"debt,omitempty"`
	Algorithm string `json:"algorithm"`
	Calendar  string `json:"calendar,omitempty"`
	TimeZone  string `json:"time_zone,omitempty"`
}

// algorithms are the Algorithms by their names.
var algorithms = map[string]Algorithm{GCRA.String(): GCRA, FixedWindow.String(): FixedWindow, SlidingWindow.String(): SlidingWindow}

func newPolicyDoc(c Config) policyDoc {
	d := policyDoc{Strategy: c.Strategy, Overrides: c.Overrides, Limits: make([]limitDoc, len(c.Limits))}
	for i, l := range c.Limits {
		d.Limits[i] = limitDoc{Name: l.Name, Rate: l.Rate, PeriodUS: l.Period.Microseconds(), Burst: l.Burst, Debt: l.Debt,
			Algorithm: l.Algorithm.String(), Calendar: l.Calendar, TimeZone: l.TimeZone}
	}
	return d
}

func (d policyDoc) recorded(table, namespace string, at time.Time, latest bool) RecordedPolicy {
	p := RecordedPolicy{Table: table, Overrides: d.Overrides, Recorded: at, Latest: latest,
		Policy: Policy{Namespace: namespace, Strategy: d.Strategy, Limits: make([]Limit, len(d.Limits))}}
	for i, l := range d.Limits {
		p.Limits[i] = Limit{Name: l.Name, Rate: l.Rate, Period: time.Duration(l.PeriodUS) * time.Microsecond, Burst: l.Burst, Debt: l.Debt,
			Algorithm: algorithms[l.Algorithm], Calendar: l.Calendar, TimeZone: l.TimeZone}
	}
	return p
}

// recordRetry is how soon a record that failed for a reason that may pass
// is tried again, at the next decision after it.
const recordRetry = time.Minute

// errNoPoliciesTable is a schema without pglimit_policies, or a standby.
var errNoPoliciesTable = errors.New("no table to record the policy in")

// record records the limiter's policy in pglimit_policies, once its first
// decision is made, on a goroutine of its own, so that no decision waits
// for it: a catalog read, then one upsert, together bounded by
// Config.Timeout. Nothing depends on it: where it cannot write, the
// limiter decides as before, and the first failure other than the database
// out of reach, slow or read-only (which the decisions report) or an error
// no server gave (a pool closed meanwhile) is logged
// (slog's default logger, at Warn). A failure that may pass (the database
// unavailable or slow, a schema not migrated yet, a standby) is tried
// again at the first decision a minute (recordRetry) later; any other (a role without INSERT on the
// table) is not, so that the server's log does not repeat it. Only a
// limiter over a pool records: one over a single connection or a
// transaction would use it at the same time as its decisions do, which
// neither allows, and a failed statement would abort the transaction.
// Its statements run under the values of call, the decision's context
// (not its deadline): a tracer sees them under that call's span.
func (l *limiter) record(call context.Context) {
	at := l.recordAt.Load()
	if at < 0 || at > 0 && time.Now().UnixNano() < at || !isPool(l.db) || !l.recordAt.CompareAndSwap(at, -1) {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeoutCause(context.WithoutCancel(call), l.cfg.Timeout, ErrTimeout)
		defer cancel()
		err := l.recordPolicy(ctx)
		if err == nil {
			return
		}
		// The database out of reach, slow or read-only is the decisions'
		// to report, and an error no server gave (the pool closed
		// meanwhile, say) its owner's; this says only what they do not.
		passing := ctx.Err() != nil || pgtx.Unavailable(err) || pgtx.ReadOnly(err) ||
			pgtx.Code(err) == "" && !errors.Is(err, errNoPoliciesTable)
		if !passing && !l.recordLogged.Swap(true) {
			slog.Warn("pglimit: the limiter's policy was not recorded; the operator command cannot check a description of it",
				"namespace", l.cfg.Namespace, "table", l.table, "error", err)
		}
		if passing || errors.Is(err, errNoPoliciesTable) {
			l.recordAt.Store(time.Now().Add(cmp.Or(l.cfg.recordRetry, recordRetry)).UnixNano())
		}
	}()
}

// recordPolicy is record's work.
func (l *limiter) recordPolicy(ctx context.Context) error {
	table := pgx.Identifier{l.cfg.Schema, policiesTable}.Sanitize()
	var can bool
	if err := l.db.QueryRow(ctx, queries.Static("policies.can_record"), table).Scan(&can); err != nil {
		return err
	}
	if !can {
		return fmt.Errorf("%w: table %s does not exist (apply migration 00011: pglimit.Migrate), or the server is a standby", errNoPoliciesTable, table)
	}
	doc, err := json.Marshal(newPolicyDoc(l.cfg))
	if err != nil {
		return err
	}
	_, err = l.db.Exec(ctx, queries.Text("policies.record", queries.Args{"policies": table}), l.cfg.Table, l.cfg.Namespace, string(doc))
	return err
}

// isPool reports whether db is a pool, safe for concurrent use: a
// *pgxpool.Pool, or database/sql's (pglimitsql.DB), with or without a
// bound on its connections.
func isPool(db DB) bool {
	switch db.(type) {
	case *pgxpool.Pool, interface{ Stats() sql.DBStats }:
		return true
	}
	return false
}
