package pglimit

import (
	"time"

	"github.com/pglimit/cooldown/pglimit/internal/arith"
)

// Decision is the outcome of a [Limiter] call. Durations are measured on
// the database clock, at the one instant the decision used: after any wait
// for the key's row lock, when it writes, which is also when the units it
// admits are counted from.
type Decision struct {
	// Allowed reports whether the request was admitted.
	Allowed bool

	// Granted is how many units were admitted: n for an admitted AllowN,
	// between 1 and n for AllowAtMost, 0 for a refusal.
	Granted int

	// Remaining is how many units the key could use right after this
	// decision, under the limit closest to exhaustion ([Decision.Limit]).
	Remaining int

	// RetryAfter is how long a refused caller should wait before the same
	// request may be admitted: the longest wait among the limits that
	// refused it. Zero when Allowed. When a concurrent decision was in
	// flight and its outcome is not known, it is an upper bound: the
	// longest any limit can make a key wait.
	RetryAfter time.Duration

	// ResetAfter is the time until the binding limit is back to its full
	// burst or quota: about the cooldown after a cooldown's admission.
	ResetAfter time.Duration

	// Delay is, for [Limiter.Reserve], how long the caller must wait
	// before acting on the units it reserved. Zero otherwise.
	Delay time.Duration

	// Limit is the binding limit: for an admission, the one with the
	// fewest units remaining; for a refusal, the violated one with the
	// longest wait.
	Limit Limit

	// Shadow reports a refusal that [Config.Shadow] let through: Allowed
	// is true and Granted is the units asked for, but nothing was
	// consumed; the other fields are the refusal's.
	Shadow bool

	// Fallback reports a decision made in process by [Config.Fallback]
	// while the database was unavailable. Limit and Violated name the
	// fallback's limits.
	Fallback bool

	// Replayed reports the first decision of an id ([WithID]) returned to
	// a later call with the same id, which charged nothing. A decision
	// with an id, first or replayed, is refunded or settled by its id
	// ([RefundID], [SettleID]), from any instance; [Limiter.Refund] and
	// [Settle] of its value are [ErrInvalidCost] and [ErrNotAdmitted].
	Replayed bool

	violated uint16  // bit i: the policy's limit i refused
	policy   *Policy // the limiter's, for Violated
	next     time.Duration
	at       int64         // the database time the decision used, µs since the epoch; 0 if none
	leased   bool          // handed out from a lease: at is an upper estimate
	refund   *refundTicket // an admission's, for Refund; nil otherwise
}

// Violated returns the limits that refused the request, in the limiter's
// order; none when it was admitted.
func (d Decision) Violated() []Limit {
	if d.violated == 0 || d.policy == nil {
		return nil
	}
	var out []Limit
	for i, l := range d.policy.Limits {
		if d.violated&(1<<i) != 0 {
			out = append(out, l)
		}
	}
	return out
}

// shadowed is d, a refusal of n units, let through by shadow mode.
func (d Decision) shadowed(n int) Decision {
	d.Allowed, d.Granted, d.Shadow, d.Delay, d.next = true, n, true, 0, 0
	return d
}

func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// longestWait is the longest the limit can make a key wait: a full burst
// for GCRA, a window, or two for the sliding window.
func (l Limit) longestWait() time.Duration {
	switch l.Algorithm {
	case GCRA:
		return micros(int64(l.Burst) * l.emission())
	case SlidingWindow:
		return 2 * l.Period
	}
	if l.Calendar != "" {
		return arith.Slack(l.Calendar) // longer than any of its windows
	}
	return l.Period
}

// gcraDecision builds the decision of a single GCRA limit l from what its
// statement returned: whether it admitted n units, the key's theoretical
// arrival time after the decision (or, for a refusal, as it stood) and the
// database time, both in µs since the epoch.
func (l *limiter) gcraDecision(admitted bool, tat, now int64, n int) Decision {
	lim := l.cfg.Limits[0]
	t := lim.emission()
	burst := int64(lim.Burst) * t
	base := max(tat, now)
	d := Decision{
		Allowed:    admitted,
		Remaining:  int(max((now+burst-base)/t, 0)),
		ResetAfter: micros(max(tat-now, 0)),
		Limit:      lim,
		policy:     l.policy,
		at:         now,
	}
	if admitted {
		d.Granted = n
		if d.Remaining == 0 {
			d.next = micros(base + t - now - burst)
		}
		return d
	}
	d.violated = 1
	d.RetryAfter = micros(base + int64(n)*t - now - burst)
	if n == 1 {
		d.next = d.RetryAfter
	}
	return d
}

// followGCRA is the follower's answer to a single GCRA limit's decision d,
// elapsed after its leader was sent: a refusal if n units still do not fit,
// else false. A decision that did not come from the database (a lost race,
// whose wait is an upper bound) is never shared.
//
// Whether the units fit is judged at the latest database time the follower
// may wake at, d's plus elapsed, as the pre-block judges; the refusal's
// figures are measured at d's own database time, the one instant the
// decision used, so that they are exact on a clock that stands still, and
// at worst the leader's round trip long elsewhere, as a statement's own
// answer is. The pre-block's wait (next) stays the shorter one: it is
// counted from the follower's own start, which may be after d's.
func (l *limiter) followGCRA(d Decision, n int, elapsed time.Duration) (Decision, bool) {
	if d.at == 0 {
		return Decision{}, false
	}
	tat := d.at + d.ResetAfter.Microseconds()
	woken := l.gcraDecision(false, tat, d.at+elapsed.Microseconds(), n)
	if woken.RetryAfter <= 0 {
		return Decision{}, false
	}
	out := l.gcraDecision(false, tat, d.at, n)
	out.next = woken.next
	return out, true
}
