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
	OutcomeInvalid  = "invalid" // a bad key or cost, or an unsupported call; nothing reached the database

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
			Help: "Limiter decisions, by limiter (namespace), strategy and outcome (admitted, refused, error, invalid, canceled).",
		}, []string{"limiter", "strategy", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pglimit_decision_duration_seconds",
			Help:    "Time to decide, database round trips included, by limiter (namespace), strategy and outcome.",
			Buckets: o.Buckets,
		}, []string{"limiter", "strategy", "outcome"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pglimit_errors_total",
			Help: "Failed limiter calls (decisions and peeks) by limiter (namespace), strategy and kind: a SQLSTATE, or timeout, connect, network, other. Callers that gave up are not counted.",
		}, []string{"limiter", "strategy", "kind"}),
	}
	cs := []prometheus.Collector{m.decisions, m.duration, m.errors}
	if o.MaxKeys > 0 {
		m.keys = NewCappedLabel(o.MaxKeys)
		m.keyDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pglimit_key_decisions_total",
			Help: fmt.Sprintf("Limiter decisions by key, for the first %d keys seen; later keys are counted as %q.", o.MaxKeys, OtherKey),
		}, []string{"limiter", "strategy", "key", "outcome"})
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

// Instrument returns lim with every decision counted and timed under the
// labels limiter (its namespace) and strategy, both read from
// [pglimit.Limiter.Policy]. Allow, AllowN, AllowTx, AllowTxN, AllowAtMost
// and Reserve are decisions. Peek is not: it consumes nothing, and counting
// it would inflate the admitted and refused rates, so only its errors are
// counted (in pglimit_errors_total). Reset passes through uncounted.
// Decisions and errors pass through unchanged.
//
// Namespaces are configuration, not user input, so the limiter label stays
// bounded by the number of limiters an application creates.
func (m *Metrics) Instrument(lim pglimit.Limiter) pglimit.Limiter {
	p := lim.Policy()
	l := &instrumented{lim: lim, m: m, labels: []string{p.Namespace, string(cmp.Or(p.Strategy, pglimit.Upsert))}}
	// Present from the start, so rates and ratios have a series to read
	// before the first refusal or error.
	for _, o := range []string{OutcomeAdmitted, OutcomeRefused, OutcomeError, OutcomeCanceled} {
		m.decisions.WithLabelValues(l.label(o)...)
		m.duration.WithLabelValues(l.label(o)...)
	}
	return l
}

// instrumented decorates a limiter. It embeds no Limiter, so that a method
// added to the interface cannot pass through uncounted unnoticed.
type instrumented struct {
	lim    pglimit.Limiter
	m      *Metrics
	labels []string // limiter, strategy
}

var _ pglimit.Limiter = (*instrumented)(nil)

// label returns the limiter's labels followed by v.
func (l *instrumented) label(v ...string) []string {
	return append(append(make([]string, 0, len(l.labels)+len(v)), l.labels...), v...)
}

func (l *instrumented) Allow(ctx context.Context, key string) (pglimit.Decision, error) {
	start := time.Now()
	d, err := l.lim.Allow(ctx, key)
	l.observe(ctx, key, d, err, time.Since(start))
	return d, err
}

func (l *instrumented) AllowN(ctx context.Context, key string, n int) (pglimit.Decision, error) {
	start := time.Now()
	d, err := l.lim.AllowN(ctx, key, n)
	l.observe(ctx, key, d, err, time.Since(start))
	return d, err
}

func (l *instrumented) AllowTx(ctx context.Context, tx pgx.Tx, key string) (pglimit.Decision, error) {
	start := time.Now()
	d, err := l.lim.AllowTx(ctx, tx, key)
	l.observe(ctx, key, d, err, time.Since(start))
	return d, err
}

func (l *instrumented) AllowTxN(ctx context.Context, tx pgx.Tx, key string, n int) (pglimit.Decision, error) {
	start := time.Now()
	d, err := l.lim.AllowTxN(ctx, tx, key, n)
	l.observe(ctx, key, d, err, time.Since(start))
	return d, err
}

func (l *instrumented) AllowAtMost(ctx context.Context, key string, n int) (pglimit.Decision, error) {
	start := time.Now()
	d, err := l.lim.AllowAtMost(ctx, key, n)
	l.observe(ctx, key, d, err, time.Since(start))
	return d, err
}

func (l *instrumented) Reserve(ctx context.Context, key string, n int, maxDelay time.Duration) (pglimit.Decision, error) {
	start := time.Now()
	d, err := l.lim.Reserve(ctx, key, n, maxDelay)
	l.observe(ctx, key, d, err, time.Since(start))
	return d, err
}

func (l *instrumented) Peek(ctx context.Context, key string, n int) (pglimit.Decision, error) {
	d, err := l.lim.Peek(ctx, key, n)
	if err != nil && !invalid(err) && !canceled(ctx, err) {
		l.m.errors.WithLabelValues(l.label(ErrorKind(err))...).Inc()
	}
	return d, err
}

func (l *instrumented) Reset(ctx context.Context, key string) error { return l.lim.Reset(ctx, key) }

func (l *instrumented) Policy() pglimit.Policy { return l.lim.Policy() }

func (l *instrumented) observe(ctx context.Context, key string, d pglimit.Decision, err error, took time.Duration) {
	var outcome string
	switch {
	case invalid(err):
		// Not a database error and not worth a latency sample; the key
		// may be arbitrary bytes, so it gets no per-key label either.
		l.m.decisions.WithLabelValues(l.label(OutcomeInvalid)...).Inc()
		return
	case canceled(ctx, err):
		outcome = OutcomeCanceled
	case err != nil:
		outcome = OutcomeError
		l.m.errors.WithLabelValues(l.label(ErrorKind(err))...).Inc()
	case d.Allowed:
		outcome = OutcomeAdmitted
	default:
		outcome = OutcomeRefused
	}
	l.m.decisions.WithLabelValues(l.label(outcome)...).Inc()
	l.m.duration.WithLabelValues(l.label(outcome)...).Observe(took.Seconds())
	if l.m.keyDecisions != nil {
		l.m.keyDecisions.WithLabelValues(l.label(l.m.keys.Value(key), outcome)...).Inc()
	}
}

// invalid reports whether err is the caller's mistake, found before the
// database was asked: a bad key or cost, or a call the limiter cannot do.
func invalid(err error) bool {
	return errors.Is(err, pglimit.ErrInvalidKey) || errors.Is(err, pglimit.ErrInvalidCost) || errors.Is(err, pglimit.ErrUnsupported)
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
// "timeout" for [pglimit.ErrTimeout] or a deadline, "canceled",
// "read_only" for [pglimit.ErrReadOnly] (a standby), "connect" when no
// connection could be made, "network" for a connection lost on the way,
// and "other". The set of values is bounded.
func ErrorKind(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, pglimit.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, pglimit.ErrReadOnly):
		return "read_only"
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
