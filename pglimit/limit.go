package pglimit

import (
	"cmp"
	"fmt"
	"strconv"
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
)

// Algorithm says how a [Limit] counts. docs/limits.md defines each exactly.
type Algorithm int

const (
	// GCRA (the generic cell rate algorithm) admits a smooth rate: up to
	// Burst requests at once, then one every Period/Rate. It keeps one
	// timestamp per key and limit. The default.
	GCRA Algorithm = iota

	// FixedWindow admits at most Rate per window of length Period, a
	// window starting at the key's first admitted request after the
	// previous one ended. For hard quotas (per day, per month).
	FixedWindow

	// SlidingWindow approximates a sliding window of length Period with two
	// counters: windows aligned to multiples of Period, the previous one's
	// count weighted by how much of it the sliding window still covers. It
	// admits at most 2*Rate in any interval of length Period, and Rate when
	// the previous window's requests were spread evenly.
	SlidingWindow
)

// String returns the algorithm's lower-case name, such as "gcra".
func (a Algorithm) String() string {
	switch a {
	case GCRA:
		return "gcra"
	case FixedWindow:
		return "fixed_window"
	case SlidingWindow:
		return "sliding_window"
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}

// Limit is one rule a key must satisfy: Rate per Period, counted by
// Algorithm.
type Limit struct {
	// Name identifies the limit in decisions, headers (RateLimit-Policy)
	// and metrics: an HTTP token (letters, digits and !#$%&'*+-.^_`|~) of
	// at most 64 bytes, unique within a limiter. Defaults to
	// "<Rate>-per-<Period>", such as "5-per-1m0s".
	Name string

	// Rate is how many units a key may use per Period. Must be positive.
	Rate int

	// Period is the window the Rate applies to: at least 1ms, at most 366
	// days, and at least 1µs per unit of Rate.
	Period time.Duration

	// Burst is, for GCRA, how many units a key may use at once. Must not
	// be negative, and a full burst must replenish within 366 days
	// (Burst*Period/Rate); window algorithms take none. Defaults to 1, so
	// Limit{Rate: 5, Period: time.Minute} admits one request and then one
	// every 12 s, where PerMinute(5), with a burst of 5, admits five at once.
	Burst int

	// Algorithm says how the limit counts. Defaults to [GCRA].
	Algorithm Algorithm

	// Debt is how many units past the limit a [Settle] may charge a key
	// whose real cost exceeded its estimate: the key is then refused until
	// the debt is repaid at the limit's rate, and what would exceed Debt is
	// forgiven. A window's count past Rate carries into the next window.
	// Must not be negative; a window's must not exceed Rate, and a GCRA
	// limit's Burst+Debt must replenish within 366 days. Defaults to 0: a
	// settle charges only what the key has left. Not on a Citus
	// distributed table.
	Debt int

	// Calendar, for a FixedWindow, aligns its windows to the calendar of
	// TimeZone: "minute", "hour", "day", "week" (from Monday), "month" or
	// "year", so that "20 a day" means per calendar day. A day lasts 23 or
	// 25 hours when the clocks change, a month 28 to 31 days. Period must
	// then be zero; it becomes the unit's nominal length (a month's is 30
	// days), which the RateLimit-Policy header reports, while RetryAfter
	// and ResetAfter are the time to the real end of the window. Defaults
	// to "": a window starts at the key's first request.
	Calendar string

	// TimeZone is the IANA name of the zone whose calendar a Calendar
	// window follows, such as "Europe/Paris". The database's time zone
	// data decides; Go's must know the zone too. Defaults to "UTC".
	TimeZone string

	loc *time.Location // TimeZone's, for a Calendar window
}

// PerSecond returns a GCRA limit of n per second, with a burst of n.
func PerSecond(n int) Limit { return per(n, time.Second) }

// PerMinute returns a GCRA limit of n per minute, with a burst of n.
func PerMinute(n int) Limit { return per(n, time.Minute) }

// PerHour returns a GCRA limit of n per hour, with a burst of n.
func PerHour(n int) Limit { return per(n, time.Hour) }

// PerDay returns a GCRA limit of n per day, with a burst of n.
//
// It is a rate with a burst, not a calendar day's quota: a key that uses
// its n units at once gets one back 24h/n later and all of them a day
// later, whatever the time of day, and none come back at midnight. For n
// per calendar day, from midnight in a zone, use Limit{Rate: n,
// Algorithm: FixedWindow, Calendar: "day"} (docs/limits.md, "FixedWindow
// on the calendar").
func PerDay(n int) Limit { return per(n, 24*time.Hour) }

func per(n int, period time.Duration) Limit {
	return Limit{Rate: n, Period: period, Burst: n}
}

// Bounds on limits, so that every quantity fits the integer arithmetic the
// statements do in microseconds.
const (
	// MaxLimits is the most limits one limiter enforces at once.
	MaxLimits = 8

	maxLimitName = 64
	minPeriod    = time.Millisecond
	maxPeriod    = 366 * 24 * time.Hour
	maxRate      = 1 << 30
)

// emission is a limit's interval per unit, in microseconds, rounded up so
// that a limit is never faster than asked.
func (l Limit) emission() int64 {
	p := l.Period.Microseconds()
	r := int64(l.Rate)
	return (p + r - 1) / r
}

// micros is the limit in the integers its decisions use: the period and
// the emission interval T in µs, the rate, and the burst's span Burst*T.
func (l Limit) micros() (period, rate, t, burstT int64) {
	t = l.emission()
	return l.Period.Microseconds(), int64(l.Rate), t, int64(l.Burst) * t
}

// spec is the limit as the decision arithmetic (internal/arith) reads it.
func (l Limit) spec() arith.Limit {
	P, R, T, BT := l.micros()
	s := arith.Limit{Algorithm: arith.Algorithm(l.Algorithm), Period: P, Rate: R, T: T, BurstT: BT, Debt: int64(l.Debt)}
	if l.Calendar != "" {
		s.Calendar = &arith.Calendar{Unit: l.Calendar, Zone: l.TimeZone, Loc: l.loc}
	}
	return s
}

// specs is limits as the decision arithmetic reads them.
func specs(limits []Limit) []arith.Limit {
	out := make([]arith.Limit, len(limits))
	for i, l := range limits {
		out[i] = l.spec()
	}
	return out
}

// capacity is how many units the limit admits at once from a fresh state.
func (l Limit) capacity() int {
	if l.Algorithm == GCRA {
		return l.Burst
	}
	return l.Rate
}

// withDefaults validates l, the i-th limit, and fills its defaults.
func (l Limit) withDefaults(i int) (Limit, error) {
	field := func(name string) string { return fmt.Sprintf("Limits[%d].%s", i, name) }
	if l.Calendar != "" {
		var err error
		if l, err = l.withCalendar(field); err != nil {
			return l, err
		}
	} else if l.TimeZone != "" {
		return l, fmt.Errorf("%w: %s applies to a Calendar window only", ErrInvalidConfig, field("TimeZone"))
	}
	switch {
	case l.Algorithm < GCRA || l.Algorithm > SlidingWindow:
		return l, fmt.Errorf("%w: %s is %s, not one of GCRA, FixedWindow, SlidingWindow", ErrInvalidConfig, field("Algorithm"), l.Algorithm)
	case l.Rate <= 0 || l.Rate > maxRate:
		return l, fmt.Errorf("%w: %s must be in [1, %d], got %d", ErrInvalidConfig, field("Rate"), maxRate, l.Rate)
	case l.Period < minPeriod || l.Period > maxPeriod:
		return l, fmt.Errorf("%w: %s must be in [%s, %s], got %s", ErrInvalidConfig, field("Period"), minPeriod, maxPeriod, l.Period)
	case l.Period/time.Duration(l.Rate) < time.Microsecond:
		return l, fmt.Errorf("%w: %s: %d per %s is more than one per microsecond", ErrInvalidConfig, field("Rate"), l.Rate, l.Period)
	case l.Burst < 0 || l.Burst > maxRate:
		return l, fmt.Errorf("%w: %s must be in [0, %d], got %d", ErrInvalidConfig, field("Burst"), maxRate, l.Burst)
	case l.Burst != 0 && l.Algorithm != GCRA:
		return l, fmt.Errorf("%w: %s applies to GCRA only; %s takes none", ErrInvalidConfig, field("Burst"), l.Algorithm)
	}
	if l.Algorithm == GCRA && l.Burst == 0 {
		l.Burst = 1
	}
	switch {
	case l.Debt < 0 || l.Debt > maxRate:
		return l, fmt.Errorf("%w: %s must be in [0, %d], got %d", ErrInvalidConfig, field("Debt"), maxRate, l.Debt)
	case l.Algorithm != GCRA && l.Debt > l.Rate:
		return l, fmt.Errorf("%w: %s of a window must not exceed its Rate (%d), got %d: a window repays at most Rate", ErrInvalidConfig, field("Debt"), l.Rate, l.Debt)
	case l.Algorithm == GCRA && int64(l.Burst)+int64(l.Debt) > maxPeriod.Microseconds()/l.emission():
		return l, fmt.Errorf("%w: %s: a burst of %d and a debt of %d at %d per %s take more than %s to replenish", ErrInvalidConfig, field("Debt"), l.Burst, l.Debt, l.Rate, l.Period, maxPeriod)
	}
	if l.Algorithm == GCRA && int64(l.Burst) > maxPeriod.Microseconds()/l.emission() {
		// Keeps Burst*T, and every sum the statements make of it, far
		// inside 64 bits.
		return l, fmt.Errorf("%w: %s: a burst of %d at %d per %s takes more than %s to replenish", ErrInvalidConfig, field("Burst"), l.Burst, l.Rate, l.Period, maxPeriod)
	}
	if l.Name == "" {
		l.Name = fmt.Sprintf("%d-per-%s", l.Rate, cmp.Or(l.Calendar, l.Period.String()))
	}
	if err := validToken(l.Name); err != nil {
		return l, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, field("Name"), err)
	}
	return l, nil
}

// validToken reports whether s is an HTTP token (RFC 9110 tchar) of at
// most maxLimitName bytes, fit for a RateLimit-Policy name.
func validToken(s string) error {
	if s == "" || len(s) > maxLimitName {
		return fmt.Errorf("%q must be 1 to %d bytes", s, maxLimitName)
	}
	for i := range len(s) {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c < 0x80 && tokenPunct[c]:
		default:
			return fmt.Errorf("%q is not an HTTP token: byte %q at %d", s, c, i)
		}
	}
	return nil
}

var tokenPunct = [128]bool{'!': true, '#': true, '$': true, '%': true, '&': true, '\'': true, '*': true,
	'+': true, '-': true, '.': true, '^': true, '_': true, '`': true, '|': true, '~': true}
