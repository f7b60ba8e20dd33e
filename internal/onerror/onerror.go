// Package onerror holds what the HTTP middleware and the gRPC interceptors
// share about a limiter that fails: the policy that says what a request
// gets, and a log of failures at a bounded rate.
package onerror

import (
	"cmp"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Policy says what a request gets when the limiter fails. Each integration
// documents what its values answer.
type Policy int

// The policies.
const (
	Unavailable Policy = iota
	FailOpen
	FailClosed
)

func (p Policy) String() string {
	switch p {
	case Unavailable:
		return "unavailable"
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	}
	return fmt.Sprintf("ErrorPolicy(%d)", int(p))
}

// Valid reports whether p is one of the policies.
func (p Policy) Valid() bool { return p == Unavailable || p == FailOpen || p == FailClosed }

// Parse returns the policy named s: "unavailable", "fail-open" or
// "fail-closed".
func Parse(s string) (Policy, error) {
	for _, p := range []Policy{Unavailable, FailOpen, FailClosed} {
		if s == p.String() {
			return p, nil
		}
	}
	return 0, fmt.Errorf("error policy %q is not one of unavailable, fail-open, fail-closed", s)
}

// Log logs limiter failures at a bounded rate: the first at once, then at
// most one line per Interval, counting those left out in between. Those
// left out after the last line are counted in the next one.
type Log struct {
	Logger   *slog.Logger // nil: slog.Default()
	Interval time.Duration
	Message  string // the line's message, such as "pglimithttp: limiter failed"

	mu         sync.Mutex
	last       time.Time // zero until the first line
	suppressed int
}

// Record logs a failure at now, with args as the line's attributes, or
// counts it for the next line.
func (l *Log) Record(now time.Time, args ...any) {
	l.mu.Lock()
	if !l.last.IsZero() && now.Sub(l.last) < l.Interval {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := l.suppressed
	l.last, l.suppressed = now, 0
	l.mu.Unlock()
	cmp.Or(l.Logger, slog.Default()).Warn(l.Message, append(args, "suppressed", suppressed)...)
}
