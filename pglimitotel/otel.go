// Package pglimitotel measures a [pglimit.Limiter]'s decisions with
// OpenTelemetry: metrics always, and a span per call when a tracer
// provider is given. Its [Observer] is the limiter's
// [pglimit.Config.Observer].
//
// The metrics, each with the attributes pglimit.limiter (the limiter's
// namespace) and pglimit.strategy:
//
//   - pglimit.decisions, a counter of decisions ({decision}), by
//     pglimit.outcome: admitted, refused, error, invalid (a bad key or
//     cost; nothing reached the database) or canceled (the caller gave up);
//   - pglimit.decision.duration, a histogram of their durations (s), by
//     pglimit.outcome, invalid ones left out;
//   - pglimit.errors, a counter of failed calls ({error}), by error.type:
//     a SQLSTATE, timeout, read_only, connect, network or other. Peek's
//     errors count here; Peek itself is no decision.
//
// Every attribute takes a bounded set of values: keys, which are user
// input, are never attributes. The spans are named "pglimit <method>"
// ("pglimit Allow"), carry the same attributes, and record an error as
// the span's status. A call's own statement runs under its span (where
// pgx's tracer can see it); a statement that group commit shares among
// callers runs under none of theirs.
//
// The package is a module of its own, so that importers of pglimit who do
// not use OpenTelemetry never download it.
package pglimitotel

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglimit/cooldown/internal/onpglimit/observe"
	"github.com/pglimit/cooldown/pglimit"
)

// scope names the instrumentation scope of the meter and the tracer.
const scope = "github.com/pglimit/cooldown/pglimitotel"

// DefaultBuckets are the duration histogram's bucket boundaries, in
// seconds: a refusal read from a hot row (well under a millisecond), an
// admission waiting for its WAL flush, row-lock queues under contention,
// and the limiter's default 2 s timeout.
var DefaultBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

// Options configures [New]. A nil *Options means defaults.
type Options struct {
	// MeterProvider gives the meter. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider

	// TracerProvider, if set, gives a span to every decision. Defaults to
	// nil: no spans.
	TracerProvider trace.TracerProvider

	// Buckets are the duration histogram's boundaries, in seconds.
	// Defaults to [DefaultBuckets].
	Buckets []float64
}

// Observer measures, and traces if asked to, the decisions of every
// limiter whose [pglimit.Config.Observer] it is. It is safe for
// concurrent use; one serves many limiters.
type Observer struct {
	decisions, errs metric.Int64Counter
	duration        metric.Float64Histogram
	tracer          trace.Tracer // nil: no spans
}

var _ pglimit.Observer = (*Observer)(nil)

// New returns an Observer that reports to opts' providers; set it as a
// limiter's [pglimit.Config.Observer]. Decisions and errors pass through
// unchanged.
func New(opts *Options) (*Observer, error) {
	o := cmp.Or(opts, &Options{})
	mp := o.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	buckets := o.Buckets
	if len(buckets) == 0 {
		buckets = DefaultBuckets
	}
	meter := mp.Meter(scope)
	var obs Observer
	var err error
	obs.decisions, err = meter.Int64Counter("pglimit.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Limiter decisions, by limiter (namespace), strategy and outcome."))
	if err != nil {
		return nil, fmt.Errorf("pglimitotel: %w", err)
	}
	obs.duration, err = meter.Float64Histogram("pglimit.decision.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to decide, database round trips included, by limiter (namespace), strategy and outcome."),
		metric.WithExplicitBucketBoundaries(buckets...))
	if err != nil {
		return nil, fmt.Errorf("pglimitotel: %w", err)
	}
	obs.errs, err = meter.Int64Counter("pglimit.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Failed limiter calls (decisions and peeks), by limiter (namespace), strategy and error.type."))
	if err != nil {
		return nil, fmt.Errorf("pglimitotel: %w", err)
	}
	if o.TracerProvider != nil {
		obs.tracer = o.TracerProvider.Tracer(scope)
	}
	return &obs, nil
}

// limiterAttributes are the attributes of the limiter that made o.
func limiterAttributes(o pglimit.Observation) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("pglimit.limiter", o.Namespace),
		attribute.String("pglimit.strategy", string(o.Strategy)),
	}
}

// StartDecision starts the decision's span, when there is a tracer
// provider, and returns ctx with it: the decision's own statement, run with
// that context, is its child.
func (obs *Observer) StartDecision(ctx context.Context, o pglimit.Observation) context.Context {
	if obs.tracer == nil {
		return ctx
	}
	ctx, _ = obs.tracer.Start(ctx, "pglimit "+string(o.Op), trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(limiterAttributes(o)...))
	return ctx
}

// EndDecision records the decision o and ends its span.
func (obs *Observer) EndDecision(ctx context.Context, o pglimit.Observation) {
	c := observe.Observed(ctx, o)
	base := limiterAttributes(o)
	with := func(kv ...attribute.KeyValue) attribute.Set {
		return attribute.NewSet(slices.Concat(base, kv)...)
	}
	if c.Outcome == observe.Error {
		obs.errs.Add(ctx, 1, metric.WithAttributeSet(with(attribute.String("error.type", observe.ErrorKind(c.Err)))))
	}
	if c.Decides {
		outcome := with(attribute.String("pglimit.outcome", c.Outcome))
		if c.Decision.Fallback {
			outcome = with(attribute.String("pglimit.outcome", c.Outcome), attribute.Bool("pglimit.fallback", true))
		}
		obs.decisions.Add(ctx, 1, metric.WithAttributeSet(outcome))
		if c.Outcome != observe.Invalid {
			obs.duration.Record(ctx, c.Took.Seconds(), metric.WithAttributeSet(outcome))
		}
	}
	if obs.tracer == nil {
		return
	}
	span := trace.SpanFromContext(ctx) // StartDecision's
	span.SetAttributes(attribute.String("pglimit.outcome", c.Outcome))
	if c.Outcome == observe.Refused || c.Outcome == observe.Shadowed {
		span.SetAttributes(attribute.Float64("pglimit.retry_after", c.Decision.RetryAfter.Seconds()))
	}
	if c.Outcome == observe.Error {
		span.SetAttributes(attribute.String("error.type", observe.ErrorKind(c.Err)))
		span.SetStatus(codes.Error, c.Err.Error())
	}
	span.End()
}
