package pglimit

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
)

// KeyState is where a key stands under each of a limiter's limits, read
// by [Inspect] and [LimitedKeys]: for the person on call, who asks why a
// key is refused and until when. It reads the row as the database holds
// it, so units an instance holds on lease (docs/limits.md) count as used.
type KeyState struct {
	Key string
	// At is the database time the figures are for.
	At time.Time
	// Limits are the key's standings, in the limiter's order.
	Limits []LimitState
	// Own is the key's own limits ([SetKeyLimits]) while they count; nil
	// if it has none. LimitedKeys gives those that differ from the
	// limiter's, without Expires and Updated.
	Own *KeyLimits
	// Invalid is the error a decision on the key returns because its row
	// of own limits is one the limits cannot use (LimitedKeys only;
	// Inspect returns it), else nil. Limits are then the limiter's.
	Invalid error
}

// LimitState is where a key stands under one limit.
type LimitState struct {
	// Limit is the limit as the key is held to it: with its own rate and
	// burst, if it has them.
	Limit Limit
	// Remaining is how many units the limit would admit at once now.
	Remaining int
	// RetryAfter is how long until the limit admits one unit; zero when
	// it does now.
	RetryAfter time.Duration
	// ResetAfter is how long until the limit is back to its full burst or
	// quota.
	ResetAfter time.Duration
	// WindowEnd is, for a window limit, when its current window ends: a
	// fixed window's quota renews then. Zero for GCRA.
	WindowEnd time.Time
}

// Refused reports whether a request of one unit would be refused now, by
// any limit.
func (s KeyState) Refused() bool {
	for _, l := range s.Limits {
		if l.Remaining < 1 {
			return true
		}
	}
	return false
}

// Inspect returns where key stands under each limit of lim, and its own
// limits, if any, reading one row and consuming nothing. It is one statement, bounded by [Config.Timeout], which writes
// nothing. [ErrUnsupported] for the Range strategy, whose rows are
// admissions, not a key's state (use [Limiter.Peek]).
func Inspect(ctx context.Context, lim Limiter, key string) (st KeyState, err error) {
	l, err := made(lim, "Inspect")
	if err != nil {
		return KeyState{}, err
	}
	err = l.act(ctx, action{op: OpInspect, key: key, validKey: true}, func(ctx context.Context) (err error) {
		st, err = l.inspect(ctx, key)
		return err
	})
	return st, err
}

// inspect is Inspect past the door.
func (l *limiter) inspect(ctx context.Context, key string) (KeyState, error) {
	db, c := l.db, l.cfg
	var (
		state    []int64
		tat      *int64
		now      int64
		doc      overrideDoc
		ownUntil *time.Time
	)
	err := db.QueryRow(ctx, l.keySQL.Inspect, c.Namespace, key).Scan(&state, &tat, &now, &doc, &ownUntil)
	if err != nil {
		return KeyState{}, statementErr(ctx, db, c, pgx.Identifier{c.Schema, c.Table}.Sanitize(), shapes[c.Strategy], "Inspect", err)
	}
	limits := c.Limits
	var own *KeyLimits
	if doc != nil {
		if limits, err = docKeyLimits(c.Limits, doc); err != nil {
			return KeyState{}, err
		}
		own = &KeyLimits{Key: key, Limits: docLimits(doc)}
		if ownUntil != nil {
			own.Expires = *ownUntil
		}
	}
	s := standing(key, limits, state, tat, now)
	s.Own = own
	return s, nil
}

// LimitedKeys returns a page of the keys of lim's namespace that would
// refuse a request of n units now, each as [Inspect] reads it.
//
// With n = 1, these are the keys at their limit. The keys come in key order,
// starting after the key after ("" for the first page), at most max (1 to
// 1000) of them. n is at least 1 and at most what the smallest of the limits
// admits at once. It is one statement that walks the namespace's rows in key
// order until it has found max, bounded by [Config.Timeout]: on a namespace
// of millions of keys with few at their limit, page through it or give a
// longer Timeout. [ErrUnsupported] for the Range strategy.
func LimitedKeys(ctx context.Context, lim Limiter, n int, after string, max int) (page []KeyState, err error) {
	l, err := made(lim, "LimitedKeys")
	if err != nil {
		return nil, err
	}
	err = l.act(ctx, action{op: OpLimitedKeys, n: n, invalid: l.checkLimitedKeys(n, after, max)}, func(ctx context.Context) (err error) {
		page, err = l.limitedKeys(ctx, n, after, max)
		return err
	})
	return page, err
}

// checkLimitedKeys validates LimitedKeys' arguments.
func (l *limiter) checkLimitedKeys(n int, after string, max int) error {
	if n < 1 || costFits(l.cfg.Limits, n, modeAllow, 0) != nil {
		return fmt.Errorf("%w: LimitedKeys: n = %d, not in [1, the smallest capacity of the limits]", ErrInvalidCost, n)
	}
	if max < 1 || max > maxPage {
		return fmt.Errorf("%w: LimitedKeys: max %d, not in [1, %d]", ErrInvalidConfig, max, maxPage)
	}
	if after != "" {
		if err := ValidateKey(after); err != nil {
			return fmt.Errorf("LimitedKeys: after: %w", err)
		}
	}
	return nil
}

// limitedKeys is LimitedKeys past the door.
func (l *limiter) limitedKeys(ctx context.Context, n int, after string, max int) ([]KeyState, error) {
	db, c := l.db, l.cfg
	var (
		now  int64
		page []struct {
			Key     string   `json:"key"`
			State   []int64  `json:"state"`
			TAT     *int64   `json:"tat"`
			Rates   []int64  `json:"rates"`
			Bursts  []int64  `json:"bursts"`
			Unknown []string `json:"unknown"`
		}
	)
	err := db.QueryRow(ctx, l.keySQL.Limited, c.Namespace, after, max, n).Scan(&now, &page)
	if err != nil {
		return nil, statementErr(ctx, db, c, pgx.Identifier{c.Schema, c.Table}.Sanitize(), shapes[c.Strategy], "LimitedKeys", err)
	}
	out := make([]KeyState, len(page))
	for i, p := range page {
		limits, invalid := c.Limits, error(nil)
		if c.Overrides {
			if own, err := keyLimits(c.Limits, p.Rates, p.Bursts, p.Unknown); err != nil {
				invalid = err
			} else {
				limits = own
			}
		}
		out[i] = standing(p.Key, limits, p.State, p.TAT, now)
		out[i].Invalid = invalid
		if own := ownOf(c.Limits, limits); own != nil {
			out[i].Own = &KeyLimits{Key: p.Key, Limits: own}
		}
	}
	return out, nil
}

// standing is key's KeyState under limits, from its row (state, tat) at
// now, all in µs, as the statements store them (arith).
func standing(key string, limits []Limit, state []int64, tat *int64, now int64) KeyState {
	s := KeyState{Key: key, At: time.UnixMicro(now), Limits: make([]LimitState, len(limits))}
	for i, st := range arith.Stand(specs(limits), state, tat, now) {
		s.Limits[i] = LimitState{Limit: limits[i], Remaining: int(st.Remaining), RetryAfter: micros(st.Retry), ResetAfter: micros(st.Reset)}
		if st.End != 0 {
			s.Limits[i].WindowEnd = time.UnixMicro(st.End)
		}
	}
	return s
}

// docKeyLimits is limits with the rates and bursts of a key's row of
// pglimit_overrides, checked as the statements check them (keyLimits).
func docKeyLimits(limits []Limit, doc overrideDoc) ([]Limit, error) {
	rates, bursts := make([]int64, len(limits)), make([]int64, len(limits))
	var unknown []string
	for name := range doc {
		if !slices.ContainsFunc(limits, func(l Limit) bool { return l.Name == name }) {
			unknown = append(unknown, name)
		}
	}
	for i, l := range limits {
		rates[i], bursts[i] = int64(l.Rate), int64(l.Burst)
		if v, ok := doc[l.Name]["rate"]; ok {
			rates[i] = int64(v)
		}
		if v, ok := doc[l.Name]["burst"]; ok {
			bursts[i] = int64(v)
		}
	}
	return keyLimits(limits, rates, bursts, unknown)
}

// ownOf is, of a key's limits, those that differ from the limiter's, as
// KeyLimits lists them: name, and the rate and burst that differ.
func ownOf(limiter, key []Limit) []Limit {
	var out []Limit
	for i, l := range key {
		var o Limit
		if l.Rate != limiter[i].Rate {
			o.Rate = l.Rate
		}
		if l.Burst != limiter[i].Burst {
			o.Burst = l.Burst
		}
		if o != (Limit{}) {
			o.Name = l.Name
			out = append(out, o)
		}
	}
	return out
}
