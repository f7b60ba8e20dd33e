package pglimitprom

import (
	"context"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglimit/cooldown/internal/onpglimit/observe"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// Outcomes, the values of the outcome label.
const (
	OutcomeAdmitted = observe.Admitted
	OutcomeRefused  = observe.Refused
	OutcomeError    = observe.Error
	OutcomeInvalid  = observe.Invalid // a bad key or cost, or an unsupported call; nothing reached the database

	// OutcomeCanceled: the caller's context was cancelled before the
	// decision came back, as when an HTTP client disconnects. The caller
	// gave up; the limiter did not fail, so it is no error.
	OutcomeCanceled = observe.Canceled

	// OutcomeShadowed: a refusal that shadow mode let through
	// ([pglimit.Config.Shadow]); it consumed nothing.
	OutcomeShadowed = observe.Shadowed
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

// Metrics holds the decision metrics shared by every limiter that has it
// as its [pglimit.Config.Observer]; one Metrics per registry.
type Metrics struct {
	decisions    *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	errors       *prometheus.CounterVec
	fallback     *prometheus.CounterVec
	level        *prometheus.GaugeVec
	keyDecisions *prometheus.CounterVec // nil unless Options.MaxKeys > 0
	keys         *CappedLabel

	mu   sync.RWMutex
	seen map[[2]string]struct{} // the limiters whose series exist: namespace, strategy
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
		seen: map[[2]string]struct{}{},
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pglimit_decisions_total",
			Help: "Limiter decisions, by limiter (namespace), strategy and outcome (admitted, refused, error, invalid, canceled, shadowed).",
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
		fallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pglimit_fallback_decisions_total",
			Help: "Decisions made in process while the database was unavailable (pglimit.Config.Fallback), by limiter (namespace), strategy and outcome; pglimit_decisions_total counts them too.",
		}, []string{"limiter", "strategy", "outcome"}),
		level: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pglimit_in_flight_level",
			Help: "How many of a limiter's statements group commit runs at once before calls gather (the in-flight level, which adapts), by limiter (namespace) and strategy; set at each move.",
		}, []string{"limiter", "strategy"}),
	}
	cs := []prometheus.Collector{m.decisions, m.duration, m.errors, m.fallback, m.level}
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

var (
	_ pglimit.Observer      = (*Metrics)(nil)
	_ pglimit.LevelObserver = (*Metrics)(nil)
)

// ObserveLevel sets pglimit_in_flight_level to the level the limiter moved
// to: it makes m a [pglimit.LevelObserver] too. The series appears as the
// limiter is made, at the level it starts at.
func (m *Metrics) ObserveLevel(o pglimit.LevelObservation) {
	m.level.WithLabelValues(o.Namespace, string(o.Strategy)).Set(float64(o.To))
}

// StartDecision returns ctx: the metrics need only a decision's end. It
// makes m a [pglimit.Observer], to set as [pglimit.Config.Observer]:
//
//	lim, err := pglimit.New(pool, &pglimit.Config{Cooldown: 2 * time.Second, Observer: m})
func (m *Metrics) StartDecision(ctx context.Context, _ pglimit.Observation) context.Context {
	return ctx
}

// EndDecision counts and times the decision o under the labels limiter
// (its limiter's namespace) and strategy. Allow, AllowN, AllowTx,
// AllowTxN, AllowAtMost, Reserve and a level of AllowAll are decisions
// ([pglimit.Op.Decides]). Peek, Reset, refunds, settles and Pause are not:
// counting them would inflate the admitted and refused rates, so only
// their errors are counted (in pglimit_errors_total).
//
// Namespaces are configuration, not user input, so the limiter label stays
// bounded by the number of limiters an application creates.
func (m *Metrics) EndDecision(ctx context.Context, o pglimit.Observation) {
	labels := []string{o.Namespace, string(o.Strategy)}
	m.present(labels)
	m.observe(labels, observe.Observed(ctx, o))
}

// present makes the series of the limiter labelled labels (limiter,
// strategy) exist once it has decided, so that rates and ratios have a
// series to read before its first refusal or error.
func (m *Metrics) present(labels []string) {
	k := [2]string{labels[0], labels[1]}
	m.mu.RLock()
	_, ok := m.seen[k]
	m.mu.RUnlock()
	if ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.seen[k]; ok {
		return
	}
	for _, o := range []string{OutcomeAdmitted, OutcomeRefused, OutcomeError, OutcomeCanceled, OutcomeShadowed} {
		m.decisions.WithLabelValues(labels[0], labels[1], o)
		m.duration.WithLabelValues(labels[0], labels[1], o)
	}
	m.seen[k] = struct{}{}
}

// SemaphoreStrategy is the strategy label of a semaphore's acquisitions
// ([Metrics.ObserveSemaphore]).
const SemaphoreStrategy = "semaphore"

// ObserveSemaphore counts and times a semaphore's acquisitions (Acquire
// and AcquireTx) as decisions. Their labels are limiter (the semaphore's
// namespace) and strategy [SemaphoreStrategy]: an acquired slot is
// admitted, a key whose slots are all held refused, a bad key invalid, a
// failure an error counted by kind, as for a limiter. Set it as the
// semaphore's hook:
//
//	sem, err := pglimitsem.New(pool, &pglimitsem.Config{Namespace: "exports", Slots: 2, Observe: m.ObserveSemaphore})
func (m *Metrics) ObserveSemaphore(ctx context.Context, c pglimitsem.Call) {
	d := pglimit.Decision{Allowed: c.Slot.Acquired, RetryAfter: c.Slot.RetryAfter}
	m.observe([]string{c.Namespace, SemaphoreStrategy}, observe.NewCall(ctx, "Acquire", c.Key, d, c.Err, c.Took))
}

// observe counts and times the call c of the limiter labelled labels
// (limiter, strategy).
func (m *Metrics) observe(labels []string, c observe.Call) {
	label := func(v ...string) []string {
		return append(append(make([]string, 0, len(labels)+len(v)), labels...), v...)
	}
	if c.Outcome == OutcomeError {
		m.errors.WithLabelValues(label(ErrorKind(c.Err))...).Inc()
	}
	switch {
	case !c.Decides:
	case c.Outcome == OutcomeInvalid:
		// Not a database error and not worth a latency sample; the
		// key may be arbitrary bytes, so it gets no per-key label
		// either.
		m.decisions.WithLabelValues(label(OutcomeInvalid)...).Inc()
	default:
		m.decisions.WithLabelValues(label(c.Outcome)...).Inc()
		m.duration.WithLabelValues(label(c.Outcome)...).Observe(c.Took.Seconds())
		if c.Decision.Fallback {
			m.fallback.WithLabelValues(label(c.Outcome)...).Inc()
		}
		if m.keyDecisions != nil {
			m.keyDecisions.WithLabelValues(label(m.keys.Value(c.Key), c.Outcome)...).Inc()
		}
	}
}

// ErrorKind names the kind of a limiter error, as in pglimit_errors_total:
// the SQLSTATE of a server error (e.g. "57P01" for a terminated backend),
// "timeout" for [pglimit.ErrTimeout] or a deadline, "canceled",
// "read_only" for [pglimit.ErrReadOnly] (a standby), "connect" when no
// connection could be made, "network" for a connection lost on the way,
// and "other". The set of values is bounded.
func ErrorKind(err error) string { return observe.ErrorKind(err) }

// Helpers for the collectors that read statistics at scrape time.

// describe sends descs, for a collector's Describe.
func describe(ch chan<- *prometheus.Desc, descs ...*prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

// sampler sends constant samples, for a collector's Collect.
type sampler chan<- prometheus.Metric

func (s sampler) gauge(d *prometheus.Desc, v float64) {
	s <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
}

func (s sampler) counter(d *prometheus.Desc, v float64) {
	s <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
}
