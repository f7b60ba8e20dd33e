package pglimitprom_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitprom"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type testBundle struct {
	reg    *prometheus.Registry
	m      *pglimitprom.Metrics
	pool   *pgxpool.Pool
	schema string
}

func setup(t *testing.T, opts *pglimitprom.Options) *testBundle {
	t.Helper()
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := pglimitprom.New(reg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{reg: reg, m: m, pool: testdb.Pool(t), schema: testdb.Schema(t)}
}

func (b *testBundle) limiter(t *testing.T, cfg pglimit.Config) pglimit.Limiter {
	t.Helper()
	cfg.Schema, cfg.Observer = b.schema, b.m
	lim, err := pglimit.New(b.pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// value reads one series of a gathered counter or histogram (its count).
func value(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	return -1 // absent
}

func TestObserveCountsDecisions(t *testing.T) {
	b := setup(t, nil)
	ctx := context.Background()
	lim := b.limiter(t, pglimit.Config{Strategy: pglimit.NoWait, Cooldown: time.Minute})

	for i := range 3 {
		if _, err := lim.Allow(ctx, "alice"); err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			continue
		}
		if got := value(t, b.reg, "pglimit_decisions_total", "strategy", "nowait", "outcome", "error"); got != 0 {
			t.Fatalf("error series after the first decision: %v, want present at 0", got)
		}
	}
	if _, err := lim.Allow(ctx, ""); !errors.Is(err, pglimit.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if d, err := lim.AllowTx(ctx, tx, "bob"); err != nil || !d.Allowed {
		t.Fatalf("AllowTx: %+v, %v", d, err)
	}

	for outcome, want := range map[string]float64{"admitted": 2, "refused": 2, "error": 0, "invalid": 1} {
		if got := value(t, b.reg, "pglimit_decisions_total", "strategy", "nowait", "outcome", outcome); got != want {
			t.Errorf("decisions %s = %v, want %v", outcome, got, want)
		}
	}
	if got := value(t, b.reg, "pglimit_decision_duration_seconds", "strategy", "nowait", "outcome", "refused"); got != 2 {
		t.Errorf("refused latency samples = %v, want 2", got)
	}
	if got := value(t, b.reg, "pglimit_key_decisions_total"); got != -1 {
		t.Errorf("per-key metric present without MaxKeys")
	}
	if problems, err := testutil.GatherAndLint(b.reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
}

// Every decision method is counted under the limiter's namespace and
// strategy; Peek, which consumes nothing, is not a decision.
func TestObserveEveryMethod(t *testing.T) {
	b := setup(t, nil)
	ctx := context.Background()
	lim := b.limiter(t, pglimit.Config{Namespace: "items", Limits: []pglimit.Limit{{Rate: 3, Period: time.Minute, Burst: 3}}})
	other := b.limiter(t, pglimit.Config{Namespace: "list", Strategy: pglimit.NoWait, Cooldown: time.Minute})
	if p := lim.Policy(); p.Namespace != "items" || len(p.Limits) != 1 {
		t.Fatalf("Policy of the observed limiter: %+v", p)
	}

	must := func(d pglimit.Decision, err error) pglimit.Decision {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for range 3 {
		if d := must(lim.Peek(ctx, "k", 1)); !d.Allowed {
			t.Fatalf("Peek: %+v", d)
		}
	}
	if d := must(lim.AllowN(ctx, "k", 2)); !d.Allowed {
		t.Fatalf("AllowN(2): %+v", d)
	}
	if d := must(lim.AllowAtMost(ctx, "k", 5)); d.Granted != 1 {
		t.Fatalf("AllowAtMost(5): %+v, want 1 granted", d)
	}
	if d := must(lim.Reserve(ctx, "k", 1, time.Minute)); !d.Allowed || d.Delay <= 0 {
		t.Fatalf("Reserve: %+v, want admitted with a delay", d)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if d := must(lim.AllowTxN(ctx, tx, "k", 1)); d.Allowed {
		t.Fatalf("AllowTxN: %+v, want refused", d)
	}
	for _, n := range []int{0, 4} {
		if _, err := lim.AllowN(ctx, "k", n); !errors.Is(err, pglimit.ErrInvalidCost) {
			t.Fatalf("AllowN(%d): %v, want ErrInvalidCost", n, err)
		}
	}
	if d := must(other.Allow(ctx, "k")); !d.Allowed {
		t.Fatalf("other limiter: %+v", d)
	}

	for outcome, want := range map[string]float64{"admitted": 3, "refused": 1, "invalid": 2, "error": 0} {
		if got := value(t, b.reg, "pglimit_decisions_total", "limiter", "items", "strategy", "upsert", "outcome", outcome); got != want {
			t.Errorf("items %s = %v, want %v", outcome, got, want)
		}
	}
	if got := value(t, b.reg, "pglimit_decisions_total", "limiter", "list", "strategy", "nowait", "outcome", "admitted"); got != 1 {
		t.Errorf("list admitted = %v, want 1", got)
	}
	if got := value(t, b.reg, "pglimit_decision_duration_seconds", "limiter", "items", "outcome", "admitted"); got != 3 {
		t.Errorf("items admitted latency samples = %v, want 3 (no Peek)", got)
	}
	if problems, err := testutil.GatherAndLint(b.reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
}

func TestObserveCountsErrorsByKind(t *testing.T) {
	b := setup(t, nil)
	ctx := context.Background()

	// A held row lock makes Upsert wait past its Timeout.
	lim := b.limiter(t, pglimit.Config{Cooldown: time.Minute, Timeout: 200 * time.Millisecond})
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := lim.AllowTx(ctx, tx, "held"); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Allow(ctx, "held"); !errors.Is(err, pglimit.ErrTimeout) {
		t.Fatalf("held key: %v, want ErrTimeout", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := lim.Allow(cancelled, "k"); err == nil {
		t.Fatal("cancelled context: no error")
	}

	// A server that refuses connections.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dead, err := pgxpool.New(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	deadLim, err := pglimit.New(dead, &pglimit.Config{Cooldown: time.Minute, Observer: b.m})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := deadLim.Allow(ctx, "k"); err == nil {
		t.Fatal("dead server: no error")
	}
	// A Peek is no decision, but its failure is a failure.
	if _, err := deadLim.Peek(ctx, "k", 1); err == nil {
		t.Fatal("dead server: Peek: no error")
	}

	for kind, want := range map[string]float64{"timeout": 1, "connect": 2} {
		if got := value(t, b.reg, "pglimit_errors_total", "strategy", "upsert", "kind", kind); got != want {
			t.Errorf("errors kind=%s: %v, want %v", kind, got, want)
		}
	}
	if got := value(t, b.reg, "pglimit_errors_total", "strategy", "upsert", "kind", "canceled"); got > 0 {
		t.Errorf("errors kind=canceled: %v, want none: the caller gave up", got)
	}
	if got := value(t, b.reg, "pglimit_decisions_total", "strategy", "upsert", "outcome", "error"); got != 2 {
		t.Errorf("error decisions: %v, want 2", got)
	}
}

// A caller that goes away (an HTTP client disconnecting cancels its
// request's context) is no failure of the limiter: it is counted under
// outcome "canceled", not as an error, so that it cannot page anyone.
func TestCancelledCallerIsNotAnError(t *testing.T) {
	b := setup(t, nil)
	ctx := context.Background()
	lim := b.limiter(t, pglimit.Config{Cooldown: time.Minute})

	// One caller gives up while it waits behind a held row lock; one had
	// given up before it asked.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := lim.AllowTx(ctx, tx, "held"); err != nil {
		t.Fatal(err)
	}
	if got := value(t, b.reg, "pglimit_decisions_total", "strategy", "upsert", "outcome", "canceled"); got != 0 {
		t.Errorf("canceled series after the first decision: %v, want present at 0", got)
	}
	waiting, cancel := context.WithCancel(ctx)
	stop := time.AfterFunc(50*time.Millisecond, cancel)
	defer stop.Stop()
	if _, err := lim.Allow(waiting, "held"); !errors.Is(err, context.Canceled) {
		t.Fatalf("caller cancelled while waiting: %v, want context.Canceled", err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := lim.Allow(gone, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("caller cancelled before: %v, want context.Canceled", err)
	}

	for outcome, want := range map[string]float64{"canceled": 2, "error": 0} {
		if got := value(t, b.reg, "pglimit_decisions_total", "strategy", "upsert", "outcome", outcome); got != want {
			t.Errorf("decisions outcome=%s: %v, want %v", outcome, got, want)
		}
	}
	if got := value(t, b.reg, "pglimit_errors_total", "strategy", "upsert", "kind", "canceled"); got > 0 {
		t.Errorf("errors kind=canceled: %v, want none", got)
	}
}

func TestPerKeyLabelIsCapped(t *testing.T) {
	b := setup(t, &pglimitprom.Options{MaxKeys: 2})
	lim := b.limiter(t, pglimit.Config{Strategy: pglimit.Range, Cooldown: time.Minute})
	for _, k := range []string{"a", "b", "c", "d", "a"} {
		if _, err := lim.Allow(context.Background(), k); err != nil {
			t.Fatal(err)
		}
	}
	for key, want := range map[string]float64{"a": 1, "b": 1, "other": 2} {
		if got := value(t, b.reg, "pglimit_key_decisions_total", "key", key, "outcome", "admitted"); got != want {
			t.Errorf("key %s admitted: %v, want %v", key, got, want)
		}
	}
	if got := value(t, b.reg, "pglimit_key_decisions_total", "key", "a", "outcome", "refused"); got != 1 {
		t.Errorf("key a refused: %v, want 1", got)
	}
	if n := testutil.CollectAndCount(b.reg, "pglimit_key_decisions_total"); n != 4 {
		t.Errorf("%d per-key series, want 4 (a, b, other admitted; a refused)", n)
	}
}

func TestNewRejectsDoubleRegistration(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := pglimitprom.New(reg, &pglimitprom.Options{MaxKeys: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := pglimitprom.New(reg, nil); err == nil {
		t.Fatal("second New on one registry: no error")
	}
	if _, err := pglimitprom.New(prometheus.NewRegistry(), &pglimitprom.Options{MaxKeys: -1}); err == nil {
		t.Fatal("negative MaxKeys: no error")
	}
}

func TestErrorKind(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("%w (upsert, after 2s): %w", pglimit.ErrTimeout, context.Canceled), "timeout"},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), "timeout"},
		{fmt.Errorf("x: %w", context.Canceled), "canceled"},
		{fmt.Errorf("x: %w", &pgconn.PgError{Code: "57P01"}), "57P01"},
		{fmt.Errorf("%w (upsert): %w", pglimit.ErrReadOnly, &pgconn.PgError{Code: "25006"}), "read_only"},
		{&pgconn.PgError{Code: "bogus!"}, "other"},
		{fmt.Errorf("x: %w", io.ErrUnexpectedEOF), "network"},
		{&net.OpError{Op: "read", Err: errors.New("connection reset")}, "network"},
		{errors.New("something else"), "other"},
	} {
		if got := pglimitprom.ErrorKind(tt.err); got != tt.want {
			t.Errorf("ErrorKind(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// A refusal that shadow mode lets through is its own outcome.
func TestShadowOutcome(t *testing.T) {
	b := setup(t, nil)
	ctx := context.Background()
	lim := b.limiter(t, pglimit.Config{Cooldown: time.Minute, Shadow: true})
	for range 3 {
		if d, err := lim.Allow(ctx, "alice"); err != nil || !d.Allowed {
			t.Fatalf("Allow in shadow mode: %+v, %v", d, err)
		}
	}
	for outcome, want := range map[string]float64{"admitted": 1, "refused": 0, "shadowed": 2} {
		if got := value(t, b.reg, "pglimit_decisions_total", "outcome", outcome); got != want {
			t.Errorf("decisions %s = %v, want %v", outcome, got, want)
		}
	}
}

// A semaphore observed by ObserveSemaphore counts its acquisitions as
// decisions: an acquired slot admitted, a key whose slots are all held
// refused, a bad key invalid, a read-only server an error of its kind,
// under the limiter (its namespace) and strategy "semaphore" labels.
func TestObserveSemaphore(t *testing.T) {
	b := setup(t, nil)
	ctx := context.Background()
	cfg := pglimitsem.Config{Schema: b.schema, Namespace: "exports", Slots: 1, Observe: b.m.ObserveSemaphore}
	sem, err := pglimitsem.New(b.pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := sem.Acquire(ctx, "alice"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sem.Acquire(ctx, ""); !errors.Is(err, pglimit.ErrInvalidKey) {
		t.Fatalf("Acquire of an empty key: %v", err)
	}
	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := sem.AcquireTx(ctx, tx, "bob"); !errors.Is(err, pglimit.ErrReadOnly) {
		t.Fatalf("AcquireTx in a read-only transaction: %v", err)
	}
	for outcome, want := range map[string]float64{"admitted": 1, "refused": 2, "invalid": 1, "error": 1} {
		if got := value(t, b.reg, "pglimit_decisions_total", "limiter", "exports", "strategy", "semaphore", "outcome", outcome); got != want {
			t.Errorf("pglimit_decisions_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
	if got := value(t, b.reg, "pglimit_decision_duration_seconds", "limiter", "exports", "strategy", "semaphore", "outcome", "refused"); got != 2 {
		t.Errorf("refusals timed: %v, want 2", got)
	}
	if got := value(t, b.reg, "pglimit_errors_total", "limiter", "exports", "strategy", "semaphore", "kind", "read_only"); got != 1 {
		t.Errorf("read-only errors: %v, want 1", got)
	}
}

// The in-flight level of a limiter shows as a gauge from the start, at 2,
// and under concurrent calls stays within the pool's connections (testdb's
// have 4).
func TestObserveLevel(t *testing.T) {
	b := setup(t, nil)
	lim := b.limiter(t, pglimit.Config{Namespace: "levels", Cooldown: time.Hour})
	if got := value(t, b.reg, "pglimit_in_flight_level", "limiter", "levels", "strategy", "upsert"); got != 2 {
		t.Errorf("pglimit_in_flight_level = %v before any call, want the start, 2", got)
	}
	testdb.Spread(t, lim, 16, 100)
	got := value(t, b.reg, "pglimit_in_flight_level", "limiter", "levels", "strategy", "upsert")
	if most := float64(b.pool.Config().MaxConns); got < 1 || got > most {
		t.Errorf("pglimit_in_flight_level = %v after 1,600 calls of 16 workers, want within [1, %v]", got, most)
	}
	if problems, err := testutil.GatherAndLint(b.reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
}
