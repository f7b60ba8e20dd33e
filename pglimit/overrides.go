package pglimit

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
	"github.com/pglimit/cooldown/pglimit/internal/queries"
)

// overridesTable holds per-key limits (migration 00008).
const overridesTable = "pglimit_overrides"

// newOverrideStatements is newGeneralStatements for a limiter whose keys
// may have limits of their own, in overrides, a table in the same schema.
func newOverrideStatements(limits []Limit, table, overrides, column, lock string) generalStatements {
	var raw, derived, rates, bursts []string
	for i, l := range limits {
		name := "'" + strings.ReplaceAll(l.Name, "'", "''") + "'"
		raw = append(raw,
			fmt.Sprintf("coalesce((o.limits -> %s ->> 'rate')::bigint, %d) AS r%d", name, l.Rate, i),
			fmt.Sprintf("coalesce((o.limits -> %s ->> 'burst')::bigint, %d) AS b%d", name, l.Burst, i))
		// T rounds up, as Limit.emission does; a burst is cut to what
		// replenishes within the longest period, as Limit's check keeps it.
		P := l.Period.Microseconds()
		t := fmt.Sprintf("((%d + r%d - 1) / r%d)", P, i, i)
		b := fmt.Sprintf("least(b%d, %d / %s)", i, maxPeriod.Microseconds(), t)
		derived = append(derived, fmt.Sprintf("r%d, %s AS b%d, %s AS t%d, %s * %s AS bt%d", i, b, i, t, i, b, t, i))
		rates = append(rates, fmt.Sprintf("x.r%d", i))
		bursts = append(bursts, fmt.Sprintf("x.b%d", i))
	}
	out := fmt.Sprintf("ARRAY[%s]::bigint[], ARRAY[%s]::bigint[]", strings.Join(rates, ", "), strings.Join(bursts, ", "))
	params := func(prefix string) arith.Params {
		return func(i int) (string, string, string) {
			n := strconv.Itoa(i)
			return prefix + "r" + n, prefix + "t" + n, prefix + "bt" + n
		}
	}
	var g generalStatements
	sp := specs(limits)
	for mode := range modes {
		if mode == modeReserve && !arith.AllGCRA(sp) {
			continue
		}
		admits, state, expires := arith.DecisionSQL(sp, arith.Mode(mode), "x.state", "x.tat", "x.now", params("x."))
		guard, _, _ := arith.DecisionSQL(sp, arith.Mode(mode), "c.state", "c.tat", "c.now", params("c."))
		stmt := func(column, returning string) string {
			return queries.Text("overrides.allow", queries.Args{
				"table": table, "setting": column, "returning": returning, "lock": lock, "admits": admits, "new_state": state,
				"new_expires": expires, "guard": guard, "state": arith.Shaped(sp, "t.state"),
				"overrides": overrides, "raw": strings.Join(raw, ", "), "derived": strings.Join(derived, ", "), "limits_out": out,
			})
		}
		g.own[mode], g.tx[mode] = stmt(column, ""), stmt(xactColumn, xactReturning)
	}
	g.peek = queries.Text("overrides.peek", queries.Args{
		"table": table, "overrides": overrides, "raw": strings.Join(raw, ", "), "derived": strings.Join(derived, ", "), "limits_out": out,
	})
	return g
}

// effective returns limits with the rates and bursts a statement decided
// with, as it returned them: the key's own limits.
func effective(limits []Limit, rates, bursts []int64) ([]Limit, error) {
	if len(rates) != len(limits) || len(bursts) != len(limits) {
		return nil, fmt.Errorf("the statement returned %d rates and %d bursts for %d limits", len(rates), len(bursts), len(limits))
	}
	out := make([]Limit, len(limits))
	for i, l := range limits {
		l.Rate = int(rates[i])
		if l.Algorithm == GCRA {
			l.Burst = int(bursts[i])
		}
		out[i] = l
	}
	return out, nil
}

// SetKeyLimits gives key its own rates and bursts for some of the limits
// of the limiter cfg configures (with [Config.Overrides] set), or, with no
// limits, takes them away. Each of limits names one of cfg's by Name and
// gives its Rate, its Burst, or both; its other fields must be zero, as a
// key's limit differs from the limiter's in rate and burst only. The next decision on the key, on every
// instance, uses them; the key keeps what it has consumed (docs/limits.md).
// The same can be done with plain SQL on pglimit_overrides. A limit name
// the configuration does not have, or a rate or burst it would refuse, is
// [ErrInvalidConfig], and nothing is written.
func SetKeyLimits(ctx context.Context, db DB, cfg *Config, key string, limits ...Limit) error {
	c, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if !c.Overrides {
		return fmt.Errorf("%w: SetKeyLimits: the configuration does not set Overrides", ErrInvalidConfig)
	}
	if err := ValidateKey(key); err != nil {
		return err
	}
	table := pgx.Identifier{c.Schema, overridesTable}.Sanitize()
	if len(limits) == 0 {
		_, err := db.Exec(ctx, queries.Text("overrides.delete", queries.Args{"overrides": table}), c.Namespace, key)
		return err
	}
	doc := map[string]map[string]int{}
	for i, kl := range limits {
		j := -1
		for k, l := range c.Limits {
			if l.Name == kl.Name {
				j = k
			}
		}
		if j < 0 {
			return fmt.Errorf("%w: SetKeyLimits: limits[%d]: the limiter has no limit named %q", ErrInvalidConfig, i, kl.Name)
		}
		if _, dup := doc[kl.Name]; dup {
			return fmt.Errorf("%w: SetKeyLimits: limits[%d]: %q is given twice", ErrInvalidConfig, i, kl.Name)
		}
		l := c.Limits[j]
		switch {
		case kl.Period != 0 || kl.Algorithm != GCRA || kl.Calendar != "" || kl.TimeZone != "":
			return fmt.Errorf("%w: SetKeyLimits: limits[%d]: only Name, Rate and Burst may be set", ErrInvalidConfig, i)
		case kl.Rate < 0 || kl.Burst < 0 || (kl.Burst > 0 && l.Algorithm != GCRA) || kl.Rate == 0 && kl.Burst == 0:
			return fmt.Errorf("%w: SetKeyLimits: limits[%d]: rate %d, burst %d", ErrInvalidConfig, i, kl.Rate, kl.Burst)
		}
		fields := map[string]int{}
		if kl.Rate > 0 {
			l.Rate, fields["rate"] = kl.Rate, kl.Rate
		}
		if kl.Burst > 0 {
			l.Burst, fields["burst"] = kl.Burst, kl.Burst
		}
		if l.Calendar != "" {
			l.Period = 0 // the calendar's, filled in again
		}
		if _, err := l.withDefaults(j); err != nil {
			return fmt.Errorf("SetKeyLimits: %w", err)
		}
		doc[kl.Name] = fields
	}
	js, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	_, err = db.Exec(ctx, queries.Text("overrides.set", queries.Args{"overrides": table}), c.Namespace, key, string(js))
	return err
}
