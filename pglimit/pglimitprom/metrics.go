package pglimitprom

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglimit/cooldown/pglimit"
)

// Outcomes, the values of the outcome label.
const (
	OutcomeAdmitted = "admitted"
	OutcomeRefused  = "refused"
	OutcomeError    = "error"
	OutcomeInvalid  = "invalid" // the key failed validation; nothing reached the database

	// OutcomeCanceled: the caller's context was cancelled before the
	// decision came back, as when an HTTP client disconnects. The caller
	// gave up; the limiter did not fail, so it is no error.
	OutcomeCanceled = "canceled"
)

// OtherKey is the key label of keys past [Options.MaxKeys].
const OtherKey = "other"

// DefaultBuckets spans a decision's life: a refusal read from a hot row
// (well under a millisecond), an admission waiting for its WAL flush (a few
// milliseconds), row-lock queues under contention, and the limiter's
// default 2 s timeout.
var DefaultBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

// Options configures [New]. A nil *Options means defaults.
type Options struct {
	// Buckets of pglimit_decision_duration_seconds, in seconds. Defaults
	// to [DefaultBuckets].
	Buckets []float64

	// MaxKeys, when positive, adds pglimit_key_decisions_total with a key
	// label for the first MaxKeys distinct keys seen; later keys share the
	// label "other". Keys are usually user ids: keep it small. Defaults to
	// 0, no per-key metric.
	MaxKeys int
}

// Metrics holds the decision metrics shared by every limiter instrumented
// with it; one Metrics per registry.
type Metrics struct {
	decisions    *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	errors       *prometheus.CounterVec
	keyDecisions *prometheus.CounterVec // nil unless Options.MaxKeys > 0
	keys         *CappedLabel
}

// New creates the decision metrics and registers them with reg (nil means
// prometheus.DefaultRegisterer).
func New(reg prometheus.Registerer, opts *Options) (*Metrics, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.MaxKeys < 0 {
		return nil, fmt.Errorf("pglimitprom: MaxKeys must not be negative, got %d", o.MaxKeys)
	}
	if len(o.Buckets) == 0 {
		o.Buckets = DefaultBuckets
	}
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}

	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pglimit_decisions_total",
			Help: "Limiter decisions, by strategy and outcome (admitted, refused, error, invalid, canceled).",
		}, []string{"strategy", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pglimit_decision_duration_seconds",
			Help:    "Time to decide, database round trips included, by strategy and outcome.",
			Buckets: o.Buckets,
		}, []string{"strategy", "outcome"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pglimit_errors_total",
			Help: "Failed decisions by strategy and kind: a SQLSTATE, or timeout, connect, network, other. Callers that gave up are not counted.",
		}, []string{"strategy", "kind"}),
	}
	cs := []prometheus.Collector{m.decisions, m.duration, m.errors}
	if o.MaxKeys > 0 {
		m.keys = NewCappedLabel(o.MaxKeys)
		m.keyDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pglimit_key_decisions_total",
			Help: fmt.Sprintf("Limiter decisions by key, for the first %d keys seen; later keys are counted as %q.", o.MaxKeys, OtherKey),
		}, []string{"strategy", "key", "outcome"})
		cs = append(cs, m.keyDecisions)
	}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("pglimitprom: register: %w", err)
		}
	}
	return m, nil
}

// Instrument returns lim with every Allow and AllowTx counted and timed under
// the strategy label (empty means [pglimit.Upsert], as in pglimit.Config).
// Decisions and errors pass through unchanged.
func (m *Metrics) Instrument(lim pglimit.Limiter, strategy pglimit.Strategy) pglimit.Limiter {
	s := string(cmp.Or(strategy, pglimit.Upsert))
	l := &instrumented{Limiter: lim, m: m, strategy: s}
	// Present from the start, so rates and ratios have a series to read
	// before the first refusal or error.
	for _, o := range []string{OutcomeAdmitted, OutcomeRefused, OutcomeError, OutcomeCanceled} {
		m.decisions.WithLabelValues(s, o)
		m.duration.WithLabelValues(s, o)
	}
	return l
}

// instrumented decorates a limiter; Reset passes through uncounted.
type instrumented struct {
	pglimit.Limiter
	m        *Metrics
	strategy string
}

var _ pglimit.Limiter = (*instrumented)(nil)

func (l *instrumented) Allow(ctx context.Context, key string) (pglimit.Decision, error) {
	start := time.Now()
	d, err := l.Limiter.Allow(ctx, key)
	l.observe(ctx, key, d, err, time.Since(start))
	return d, err
}

func (l *instrumented) AllowTx(ctx context.Context, tx pgx.Tx, key string) (pglimit.Decision, error) {
	start := time.Now()
	d, err := l.Limiter.AllowTx(ctx, tx, key)
	l.observe(ctx, key, d, err, time.Since(start))
	return d, err
}

func (l *instrumented) observe(ctx context.Context, key string, d pglimit.Decision, err error, took time.Duration) {
	var outcome string
	switch {
	case errors.Is(err, pglimit.ErrInvalidKey):
		// Not a database error and not worth a latency sample; the key
		// may be arbitrary bytes, so it gets no per-key label either.
		l.m.decisions.WithLabelValues(l.strategy, OutcomeInvalid).Inc()
		return
	case canceled(ctx, err):
		outcome = OutcomeCanceled
	case err != nil:
		outcome = OutcomeError
		l.m.errors.WithLabelValues(l.strategy, ErrorKind(err)).Inc()
	case d.Allowed:
		outcome = OutcomeAdmitted
	default:
		outcome = OutcomeRefused
	}
	l.m.decisions.WithLabelValues(l.strategy, outcome).Inc()
	l.m.duration.WithLabelValues(l.strategy, outcome).Observe(took.Seconds())
	if l.m.keyDecisions != nil {
		l.m.keyDecisions.WithLabelValues(l.strategy, l.m.keys.Value(key), outcome).Inc()
	}
}

// canceled reports whether err ended a decision because ctx, the caller's,
// was cancelled: the caller gave up (an HTTP client disconnected), which
// is no failure of the limiter. The limiter's own Timeout and a deadline
// are failures, and do not count.
func canceled(ctx context.Context, err error) bool {
	return err != nil && errors.Is(err, context.Canceled) && errors.Is(ctx.Err(), context.Canceled)
}

// ErrorKind names the kind of a limiter error, as in pglimit_errors_total:
// the SQLSTATE of a server error (e.g. "57P01" for a terminated backend),
// "timeout" for [pglimit.ErrTimeout] or a deadline, "canceled", "connect"
// when no connection could be made, "network" for a connection lost on the
// way, and "other". The set of values is bounded.
func ErrorKind(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, pglimit.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && isSQLState(pgErr.Code) {
		return pgErr.Code
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return "connect"
	}
	if _, ok := errors.AsType[net.Error](err); ok || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "network"
	}
	return "other"
}

// isSQLState keeps the kind label bounded even if a server sent junk.
func isSQLState(code string) bool {
	if len(code) != 5 {
		return false
	}
	for i := range len(code) {
		if c := code[i]; (c < '0' || c > '9') && (c < 'A' || c > 'Z') {
			return false
		}
	}
	return true
}
