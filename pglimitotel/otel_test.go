package pglimitotel_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimitotel"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// instrumented returns a limiter of a 1 h cooldown in namespace ns,
// measured into a real OpenTelemetry SDK: its metric reader and its spans.
func instrumented(t *testing.T, ns string, traced bool) (pglimit.Limiter, *sdkmetric.ManualReader, *tracetest.SpanRecorder) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	opts := &pglimitotel.Options{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}
	var spans *tracetest.SpanRecorder
	if traced {
		spans = tracetest.NewSpanRecorder()
		opts.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	}
	obs, err := pglimitotel.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: testdb.Schema(t), Namespace: ns, Cooldown: time.Hour, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	return lim, reader, spans
}

// points returns, by metric name and then by the value of attribute by,
// the metric's sum (a counter) or count (a histogram).
func points(t *testing.T, reader *sdkmetric.ManualReader, by map[string]attribute.Key) map[string]map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = map[string]int64{}
			value := func(attrs attribute.Set) string {
				v, _ := attrs.Value(by[m.Name])
				return v.AsString()
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[m.Name][value(p.Attributes)] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[m.Name][value(p.Attributes)] += int64(p.Count)
				}
			}
		}
	}
	return out
}

var byOutcome = map[string]attribute.Key{
	"pglimit.decisions": "pglimit.outcome", "pglimit.decision.duration": "pglimit.outcome", "pglimit.errors": "error.type",
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	lim, reader, _ := instrumented(t, "metered", false)
	for _, key := range []string{"a", "a", "a", "b", ""} { // admitted, refused twice, admitted, invalid
		_, _ = lim.Allow(ctx, key)
	}
	if _, err := lim.Peek(ctx, "a", 1); err != nil {
		t.Fatal(err)
	}
	got := points(t, reader, byOutcome)
	want := map[string]map[string]int64{
		"pglimit.decisions":         {"admitted": 2, "refused": 2, "invalid": 1},
		"pglimit.decision.duration": {"admitted": 2, "refused": 2},
	}
	for name, w := range want {
		for outcome, n := range w {
			if got[name][outcome] != n {
				t.Errorf("%s{%s} = %d, want %d (all: %v)", name, outcome, got[name][outcome], n, got[name])
			}
		}
		if len(got[name]) != len(w) {
			t.Errorf("%s: %v, want only %v", name, got[name], w)
		}
	}
	if len(got["pglimit.errors"]) != 0 {
		t.Errorf("errors counted without an error: %v", got["pglimit.errors"])
	}
}

// A limiter whose pool is closed fails: its decisions and its peeks count
// as errors, by error.type, and the span says so.
func TestErrorsAndSpans(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.Pool(t)
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	obs, err := pglimitotel.New(&pglimitotel.Options{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
	})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: testdb.Schema(t), Cooldown: time.Hour, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("first decision: %+v, %v", d, err)
	}
	if _, err := lim.Allow(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	if _, err := lim.Allow(ctx, "k"); err == nil {
		t.Fatal("a decision on a closed pool succeeded")
	}
	if _, err := lim.Peek(ctx, "k", 1); err == nil {
		t.Fatal("a peek on a closed pool succeeded")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, _ = lim.Allow(cctx, "k") // the caller gave up: no error of the limiter

	got := points(t, reader, byOutcome)
	if got["pglimit.errors"]["other"] != 2 || len(got["pglimit.errors"]) != 1 {
		t.Errorf("errors %v, want 2 of type other (a closed pool)", got["pglimit.errors"])
	}
	if got["pglimit.decisions"]["error"] != 1 || got["pglimit.decisions"]["canceled"] != 1 {
		t.Errorf("decisions %v, want one error and one canceled", got["pglimit.decisions"])
	}

	ended := spans.Ended()
	if len(ended) != 5 {
		t.Fatalf("%d spans, want 5", len(ended))
	}
	for i, want := range []struct {
		name, outcome string
		failed        bool
	}{
		{"pglimit Allow", "admitted", false},
		{"pglimit Allow", "refused", false},
		{"pglimit Allow", "error", true},
		{"pglimit Peek", "error", true},
		{"pglimit Allow", "canceled", false},
	} {
		s := ended[i]
		attrs := attribute.NewSet(s.Attributes()...)
		outcome, _ := attrs.Value("pglimit.outcome")
		if s.Name() != want.name || outcome.AsString() != want.outcome || (s.Status().Code == codes.Error) != want.failed {
			t.Errorf("span %d: %s, outcome %s, status %v; want %s, %s, failed %t", i, s.Name(), outcome.AsString(), s.Status(), want.name, want.outcome, want.failed)
		}
		for _, kv := range s.Attributes() {
			if kv.Value.AsString() == "k" {
				t.Errorf("span %d carries the key as %s", i, kv.Key)
			}
		}
	}
}

// queryParents is a pgx tracer that keeps the span of every query's
// context.
type queryParents struct {
	mu    sync.Mutex
	spans []trace.SpanContext
}

func (q *queryParents) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.spans = append(q.spans, trace.SpanContextFromContext(ctx))
	return ctx
}

func (q *queryParents) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A call's own statements, which run on its caller's goroutine, run under
// its span: pgx's tracer sees the span in their context. So does the
// record of the limiter's policy that its first decision starts, on a
// goroutine of its own.
func TestStatementUnderSpan(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	queries := &queryParents{}
	cfg.ConnConfig.Tracer = queries
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	spans := tracetest.NewSpanRecorder()
	obs, err := pglimitotel.New(&pglimitotel.Options{
		MeterProvider:  sdkmetric.NewMeterProvider(),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
	})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: testdb.Schema(t), Cooldown: time.Hour, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Allow(t.Context(), "k"); err != nil || !d.Allowed {
		t.Fatalf("Allow: %+v, %v", d, err)
	}
	ended := spans.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans, want 1", len(ended))
	}
	queries.mu.Lock() // the policy's record may still run
	defer queries.mu.Unlock()
	if len(queries.spans) == 0 {
		t.Fatal("no statement traced")
	}
	for i, parent := range queries.spans {
		if !parent.Equal(ended[0].SpanContext()) {
			t.Errorf("statement %d ran under span %v, want the call's %v", i, parent.SpanID(), ended[0].SpanContext().SpanID())
		}
	}
}
