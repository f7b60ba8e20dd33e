package pglimit

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/engine"
)

// keyLimits returns limits with the rates and bursts a statement read for
// the key, as it returned them: the key's own limits. A row the limits
// cannot use, on which the statement decided nothing, is ErrInvalidConfig.
func keyLimits(limits []Limit, rates, bursts []int64, unknown []string) ([]Limit, error) {
	if len(rates) != len(limits) || len(bursts) != len(limits) {
		return nil, fmt.Errorf("the statement returned %d rates and %d bursts for %d limits", len(rates), len(bursts), len(limits))
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("%w: the key's row in %s names %q, which the limiter does not have", ErrInvalidConfig, engine.OverridesTable, unknown)
	}
	out := make([]Limit, len(limits))
	for i, l := range limits {
		var err error
		if out[i], err = l.withKeyLimits(rates[i], bursts[i]); err != nil {
			return nil, fmt.Errorf("the key's row in %s: %w", engine.OverridesTable, err)
		}
	}
	return out, nil
}

// withKeyLimits returns l with a key's own rate and burst (a burst of 0
// for a window), checked as a limit of the limiter's own is: at most one
// unit per microsecond, and a GCRA burst that replenishes within 366 days.
// The override statements check the same (internal/engine, KeyLimits).
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
// SetKeyLimitsFor, through the door.
func setKeyLimits(ctx context.Context, lim Limiter, op Op, key string, ttl time.Duration, limits []Limit) error {
	l, err := made(lim, string(op))
	if err != nil {
		return err
	}
	var invalid error
	var lapse *int64 // µs; nil: never
	switch {
	case op == OpSetKeyLimits:
	case ttl <= 0 || ttl > maxPeriod:
		invalid = fmt.Errorf("%w: SetKeyLimitsFor: ttl %s, not in (0, %s]", ErrInvalidConfig, ttl, maxPeriod)
	case len(limits) == 0:
		invalid = fmt.Errorf("%w: SetKeyLimitsFor: no limits; SetKeyLimits with none takes a key's away", ErrInvalidConfig)
	default:
		us := ttl.Microseconds()
		lapse = &us
	}
	table, err := overridesOf(l.cfg, "SetKeyLimits")
	a := action{op: op, key: key, invalid: cmp.Or(invalid, err), validKey: true}
	return l.act(ctx, a, func(ctx context.Context) error {
		return l.setKeyLimits(ctx, table, key, lapse, limits)
	})
}

// setKeyLimits writes key's own limits, lapsing after ttl µs (nil:
// never), or deletes them when there are none, in table: SetKeyLimits
// and SetKeyLimitsFor past the door.
func (l *limiter) setKeyLimits(ctx context.Context, table, key string, ttl *int64, limits []Limit) error {
	db, c := l.db, l.cfg
	sql, args := l.keySQL.DeleteLimits, []any{c.Namespace, key}
	if len(limits) > 0 {
		doc, err := keyLimitsDoc(c.Limits, limits)
		if err != nil {
			return err
		}
		sql, args = l.keySQL.SetLimits, append(args, doc, ttl)
	}
	if _, err := db.Exec(ctx, sql, args...); err != nil {
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
	return pgx.Identifier{c.Schema, engine.OverridesTable}.Sanitize(), nil
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
	table, err := overridesOf(l.cfg, "ListKeyLimits")
	if err == nil && (max < 1 || max > maxPage) {
		err = fmt.Errorf("%w: ListKeyLimits: max %d, not in [1, %d]", ErrInvalidConfig, max, maxPage)
	}
	err = l.act(ctx, action{op: OpListKeyLimits, invalid: err}, func(ctx context.Context) (err error) {
		page, err = l.listKeyLimits(ctx, table, after, max)
		return err
	})
	return page, err
}

// listKeyLimits is ListKeyLimits past the door, on table.
func (l *limiter) listKeyLimits(ctx context.Context, table, after string, max int) ([]KeyLimits, error) {
	db, c := l.db, l.cfg
	var page []struct {
		Key     string      `json:"key"`
		Limits  overrideDoc `json:"limits"`
		Expires *time.Time  `json:"expires"`
		Updated time.Time   `json:"updated"`
	}
	if err := db.QueryRow(ctx, l.keySQL.ListLimits, c.Namespace, after, max).Scan(&page); err != nil {
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
