package pglimitgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
	"github.com/pglimit/cooldown/pglimitgrpc"
)

// gated is gRPC's health service whose Check runs check with the
// request's Service first.
type gated struct {
	*health.Server
	check func(ctx context.Context, service string) error
}

func (g gated) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if err := g.check(ctx, req.Service); err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// holding is a check that holds each call until release is closed or
// the call's client leaves; a service of "panic" panics instead. inside
// returns the service of the next call held, failing the test after 10 s
// without one.
func holding() (check func(context.Context, string) error, inside func(*testing.T) string, release chan struct{}) {
	in, release := make(chan string, 16), make(chan struct{})
	inside = func(t *testing.T) string {
		t.Helper()
		select {
		case service := <-in:
			return service
		case <-time.After(10 * time.Second):
			t.Fatal("no call reached the handler in 10s")
			return ""
		}
	}
	return func(ctx context.Context, service string) error {
		if service == "panic" {
			panic("the handler panics")
		}
		in <- service
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, inside, release
}

// serveConcurrency serves gated(check) on 127.0.0.1 behind the
// concurrency interceptors of sem and cfg, with outer interceptors
// outside them, and returns a client of it.
func serveConcurrency(t *testing.T, sem *pglimitsem.Semaphore, cfg *pglimitgrpc.Config, check func(context.Context, string) error, outer ...grpc.UnaryServerInterceptor) healthpb.HealthClient {
	t.Helper()
	unary, err := pglimitgrpc.UnaryServerConcurrency(sem, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := pglimitgrpc.StreamServerConcurrency(sem, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return serveChainOf(t, gated{Server: health.NewServer(), check: check}, append(outer, unary), []grpc.StreamServerInterceptor{stream})
}

func newSemaphore(t *testing.T, pool *pgxpool.Pool, cfg pglimitsem.Config) *pglimitsem.Semaphore {
	t.Helper()
	cfg.TTL = time.Minute
	sem, err := pglimitsem.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return sem
}

// oneKey keys every call "exports".
func oneKey(context.Context, string) (string, error) { return "exports", nil }

// call calls Check for service in the background with the metadata kv,
// and returns its error.
func call(ctx context.Context, c healthpb.HealthClient, service string, kv ...string) <-chan error {
	errc := make(chan error, 1)
	go func() {
		_, err := c.Check(metadata.AppendToOutgoingContext(ctx, kv...), &healthpb.HealthCheckRequest{Service: service})
		errc <- err
	}()
	return errc
}

// heldOf counts the live slots held in schema.
func heldOf(t *testing.T, db pglimit.DB, schema string) int {
	t.Helper()
	var n int
	q := "SELECT count(*) FROM " + pgx.Identifier{schema, "pglimit_slots"}.Sanitize() + " WHERE expires_at > clock_timestamp()"
	if err := db.QueryRow(t.Context(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// slotTables is every row of schema's slot tables, as text.
func slotTables(t *testing.T, db pglimit.DB, schema string) string {
	t.Helper()
	var all []string
	for _, table := range []string{"pglimit_slots", "pglimit_slot_waiters", "pglimit_slot_flows"} {
		var rows string
		q := "SELECT coalesce(string_agg(r::text, ';' ORDER BY r::text), '') FROM " + pgx.Identifier{schema, table}.Sanitize() + " AS r"
		if err := db.QueryRow(t.Context(), q).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		all = append(all, table+": "+rows)
	}
	return strings.Join(all, "\n")
}

// bounded is the test's context, ended after 10 s: a call the test
// expects refused, if admitted, fails rather than hangs.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitUntil polls cond until it holds, failing the test after 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
	}
}

// wantBusy checks that err is the refusal of a busy key: ResourceExhausted
// with a RetryInfo, and a QuotaFailure of limit:concurrency.
func wantBusy(t *testing.T, what string, err error) {
	t.Helper()
	s := wantCode(t, what, err, codes.ResourceExhausted)
	if d, ok := pglimitgrpc.RetryDelay(err); !ok || d <= 0 || d > time.Minute {
		t.Errorf("%s: RetryInfo %s, %t; want within (0, 1m], the TTL", what, d, ok)
	}
	var subjects []string
	for _, det := range s.Details() {
		if q, ok := det.(*errdetails.QuotaFailure); ok {
			for _, v := range q.Violations {
				subjects = append(subjects, v.Subject)
			}
		}
	}
	if strings.Join(subjects, " ") != "limit:concurrency" {
		t.Errorf("%s: QuotaFailure %v, want limit:concurrency", what, subjects)
	}
}

// Two slots: of three concurrent calls two run, and the third is
// refused with ResourceExhausted, a RetryInfo and the pushback trailer;
// once the first returns, a new call gets its slot.
func TestConcurrencyRefusesPastSlots(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 2})
	hold, inside, release := holding()
	events := &recorder{}
	c := serveConcurrency(t, sem, &pglimitgrpc.Config{Key: oneKey, OnDecision: events.record}, hold)
	ctx := bounded(t)
	first, second := call(ctx, c, "1"), call(ctx, c, "2")
	inside(t)
	inside(t)
	var trailer metadata.MD
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: "3"}, grpc.Trailer(&trailer))
	wantBusy(t, "the third call", err)
	if ms, perr := strconv.ParseInt(strings.Join(trailer.Get("grpc-retry-pushback-ms"), ""), 10, 64); perr != nil || ms <= 0 {
		t.Errorf("grpc-retry-pushback-ms %v; want a positive wait", trailer.Get("grpc-retry-pushback-ms"))
	}
	var outcomes []pglimitgrpc.Outcome
	for _, ev := range events.take() {
		outcomes = append(outcomes, ev.Outcome)
	}
	if fmt.Sprint(outcomes) != "[admitted admitted busy]" {
		t.Errorf("outcomes %v, want [admitted admitted busy]", outcomes)
	}
	release <- struct{}{} // one of the two returns
	if err := firstOf(first, second); err != nil {
		t.Fatalf("a held call: %v", err)
	}
	fourth := call(ctx, c, "4")
	if got := inside(t); got != "4" {
		t.Fatalf("inside: %s, want 4", got)
	}
	close(release)
	for _, err := range []error{<-fourth, firstOf(first, second)} {
		if err != nil {
			t.Errorf("a held call: %v", err)
		}
	}
	waitUntil(t, "every slot back", func() bool { return heldOf(t, pool, schema) == 0 })
}

// firstOf returns the error of whichever of a and b answers first.
func firstOf(a, b <-chan error) error {
	select {
	case err := <-a:
		return err
	case err := <-b:
		return err
	}
}

// Two servers, each with its own semaphore of the same namespace on its
// own pool (one through PgBouncer), share the key's two slots: with one
// call held on each, a third is refused on either.
func TestConcurrencySharedAcrossInstances(t *testing.T) {
	t.Parallel()
	schema := testdb.Schema(t)
	direct := testdb.Pool(t)
	cfg := pglimitsem.Config{Schema: schema, Namespace: "exports", Slots: 2}
	hold, inside, release := holding()
	defer close(release)
	a := serveConcurrency(t, newSemaphore(t, direct, cfg), &pglimitgrpc.Config{Key: oneKey}, hold)
	b := serveConcurrency(t, newSemaphore(t, testdb.PgBouncerPool(t), cfg), &pglimitgrpc.Config{Key: oneKey}, hold)
	ctx := bounded(t)
	call(ctx, a, "a")
	inside(t)
	call(ctx, b, "b")
	inside(t)
	for name, c := range map[string]healthpb.HealthClient{"a": a, "b": b} {
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: "third"})
		wantBusy(t, "a third call on "+name, err)
	}
	if n := heldOf(t, direct, schema); n != 2 {
		t.Errorf("%d slots held, want 2", n)
	}
}

// A handler that panics (a recovery interceptor outside answers
// Internal) and a client that gives up while its handler runs both give
// the slot back.
func TestConcurrencyReleasesOnPanicAndCancel(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 1})
	hold, inside, release := holding()
	defer close(release)
	recovering := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (_ any, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = status.Errorf(codes.Internal, "recovered: %v", r)
			}
		}()
		return handler(ctx, req)
	}
	c := serveConcurrency(t, sem, &pglimitgrpc.Config{Key: oneKey}, hold, recovering)
	ctx := bounded(t)

	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: "panic"})
	wantCode(t, "a handler that panics", err, codes.Internal)
	if n := heldOf(t, pool, schema); n != 0 {
		t.Errorf("after the panic: %d slots held, want 0 (released before the status)", n)
	}

	gone, cancel := context.WithCancel(ctx)
	errc := call(gone, c, "leaving")
	inside(t)
	if n := heldOf(t, pool, schema); n != 1 {
		t.Fatalf("while a call runs: %d slots held, want 1", n)
	}
	cancel()
	wantCode(t, "a client giving up", <-errc, codes.Canceled)
	waitUntil(t, "the slot of a client that left", func() bool { return heldOf(t, pool, schema) == 0 })
	errc = call(ctx, c, "next")
	if got := inside(t); got != "next" {
		t.Fatalf("inside: %s, want next", got)
	}
	release <- struct{}{}
	if err := <-errc; err != nil {
		t.Errorf("the next call: %v", err)
	}
}

// A stream holds its slot from its opening until its handler returns:
// while it is open another stream and a unary call of the key are
// refused, and after it ends a new stream is admitted.
func TestConcurrencyStreamHoldsForItsLife(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 1})
	c := serveConcurrency(t, sem, &pglimitgrpc.Config{Key: oneKey}, func(context.Context, string) error { return nil })
	watch := func(ctx context.Context) error {
		w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		_, err = w.Recv()
		return err
	}
	open, cancel := context.WithCancel(bounded(t))
	if err := watch(open); err != nil {
		t.Fatalf("the first stream: %v", err)
	}
	time.Sleep(100 * time.Millisecond) // the stream stays open
	wantBusy(t, "a second stream", watch(bounded(t)))
	_, err := c.Check(bounded(t), &healthpb.HealthCheckRequest{})
	wantBusy(t, "a unary call while the stream is open", err)
	cancel()
	waitUntil(t, "the stream's slot", func() bool { return heldOf(t, pool, schema) == 0 })
	next, cancelNext := context.WithCancel(t.Context())
	defer cancelNext()
	if err := watch(next); err != nil {
		t.Errorf("a stream after the first ended: %v", err)
	}
}

// flowOf is the flow of a call: its x-flow metadata, weighted by
// x-weight.
func flowOf(ctx context.Context, _ string) (pglimitsem.Flow, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if len(md.Get("x-flow")) != 1 || len(md.Get("x-weight")) != 1 {
		return pglimitsem.Flow{}, errors.New("no x-flow and x-weight")
	}
	w, err := strconv.Atoi(md.Get("x-weight")[0])
	if err != nil {
		return pglimitsem.Flow{}, err
	}
	return pglimitsem.Flow{Name: md.Get("x-flow")[0], Weight: w}, nil
}

// With a Flow, calls wait for the key's slots and flows are served by
// weight: four slots, flows of weight 1 and 3 each flooding with six
// callers whose calls hold a slot 30 ms; of the calls served after the
// first 16, the heavy flow gets at least 1.5 times the light one's (3
// times by its weight; the margin is for a loaded machine) and the light
// one at least a tenth.
func TestConcurrencyFlowsShareByWeight(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 4, WaitPoll: 10 * time.Millisecond})
	const warmup, counted = 16, 80
	var (
		mu     sync.Mutex
		served = map[string]int{}
		n      int
		done   = make(chan struct{})
	)
	hold := func(ctx context.Context, flow string) error {
		mu.Lock()
		if n++; n > warmup && n <= warmup+counted {
			served[flow]++
			if n == warmup+counted {
				close(done)
			}
		}
		mu.Unlock()
		time.Sleep(30 * time.Millisecond)
		return nil
	}
	c := serveConcurrency(t, sem, &pglimitgrpc.Config{Key: oneKey, Flow: flowOf, FlowWait: time.Minute}, hold)
	flood, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for flow, weight := range map[string]string{"light": "1", "heavy": "3"} {
		for range 6 {
			wg.Go(func() {
				ctx := metadata.AppendToOutgoingContext(flood, "x-flow", flow, "x-weight", weight)
				for flood.Err() == nil {
					if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: flow}); err != nil && flood.Err() == nil {
						t.Errorf("flow %s: %v", flow, err)
						return
					}
				}
			})
		}
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Error("the flood served too few calls in 2 minutes")
	}
	stop()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("served after the warm-up: %v", served)
	if served["heavy"]*2 < served["light"]*3 || served["light"] < counted/10 {
		t.Errorf("served %v of %d; want heavy at least 1.5 times light, and light at least %d", served, counted, counted/10)
	}
}

// With a Level, a call takes a slot of its priority level: batch fills
// what critical does not keep, a third batch call is refused, and a
// critical call still gets its kept slot at once.
func TestConcurrencyLevelGuarantee(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 3, Levels: []pglimitsem.Level{
		{Name: "critical", Min: 1, Max: 3}, {Name: "batch", Max: 3},
	}})
	hold, inside, release := holding()
	defer close(release)
	c := serveConcurrency(t, sem, &pglimitgrpc.Config{Key: oneKey, Level: levelOf, FlowWait: 200 * time.Millisecond}, hold)
	ctx := bounded(t)
	for i := range 2 {
		call(ctx, c, "batch", "x-level", "batch")
		if got := inside(t); got != "batch" {
			t.Fatalf("batch call %d: inside %s", i, got)
		}
	}
	_, err := c.Check(metadata.AppendToOutgoingContext(ctx, "x-level", "batch"), &healthpb.HealthCheckRequest{})
	wantBusy(t, "a third batch call", err)
	call(ctx, c, "critical", "x-level", "critical")
	if got := inside(t); got != "critical" {
		t.Errorf("inside: %s, want critical", got)
	}
}

// levelOf is the priority level of a call: its x-level metadata.
func levelOf(ctx context.Context, _ string) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-level"); len(v) == 1 {
		return v[0], nil
	}
	return "", errors.New("no x-level")
}

// A flow or level that cannot be had or is bad fails the call with
// InvalidArgument, and the slot tables stay as they were.
func TestConcurrencyBadInput(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	flows := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Namespace: "flows", Slots: 1})
	levels := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Namespace: "levels", Slots: 2, Levels: []pglimitsem.Level{{Name: "critical", Min: 1, Max: 2}}})
	for _, sem := range []*pglimitsem.Semaphore{flows, levels} {
		if slot, err := sem.Acquire(t.Context(), "exports"); err != nil || !slot.Acquired {
			t.Fatalf("Acquire: %+v, %v", slot, err)
		}
	}
	if err := flows.SetFlowWeight(t.Context(), "acme", 2); err != nil {
		t.Fatal(err)
	}
	never := func(context.Context, string) error { t.Error("the handler ran"); return nil }
	byFlow := serveConcurrency(t, flows, &pglimitgrpc.Config{Key: oneKey, Flow: flowOf}, never)
	byLevel := serveConcurrency(t, levels, &pglimitgrpc.Config{Key: oneKey, Level: levelOf}, never)
	byBadKey := serveConcurrency(t, flows, &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("x-user"), Flow: flowOf}, never)
	before := slotTables(t, pool, schema)
	for _, tc := range []struct {
		name string
		c    healthpb.HealthClient
		kv   []string
	}{
		{"no flow", byFlow, nil},
		{"an empty flow", byFlow, []string{"x-flow", "", "x-weight", "1"}},
		{"a flow too long", byFlow, []string{"x-flow", strings.Repeat("f", pglimit.MaxKeyLength+1), "x-weight", "1"}},
		{"weight 0", byFlow, []string{"x-flow", "acme", "x-weight", "0"}},
		{"weight 10001", byFlow, []string{"x-flow", "acme", "x-weight", "10001"}},
		{"a weight that is no number", byFlow, []string{"x-flow", "acme", "x-weight", "x"}},
		{"no key", byBadKey, []string{"x-flow", "acme", "x-weight", "1"}},
		{"no level", byLevel, nil},
		{"an unknown level", byLevel, []string{"x-level", "nightly"}},
		{"an empty level", byLevel, []string{"x-level", ""}},
	} {
		_, err := tc.c.Check(metadata.AppendToOutgoingContext(bounded(t), tc.kv...), &healthpb.HealthCheckRequest{})
		wantCode(t, tc.name, err, codes.InvalidArgument)
	}
	if after := slotTables(t, pool, schema); after != before {
		t.Errorf("the slot tables changed:\nbefore %s\nafter  %s", before, after)
	}
}

// timed is an interceptor outside that measures how long the server took
// to answer each call, and its code.
type timed struct {
	mu    sync.Mutex
	took  time.Duration
	code  codes.Code
	calls int
}

func (tm *timed) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	tm.mu.Lock()
	defer tm.mu.Unlock()
	tm.took, tm.code, tm.calls = time.Since(start), status.Code(err), tm.calls+1
	return resp, err
}

func (tm *timed) last() (time.Duration, codes.Code, int) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.took, tm.code, tm.calls
}

// A call waiting for a slot of its flow answers by its deadline (100 ms,
// plus answerSlack) with DeadlineExceeded and leaves no place behind;
// one without a deadline is refused once FlowWait (300 ms) has passed,
// within answerSlack.
func TestConcurrencyFlowDeadline(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 1})
	if slot, err := sem.Acquire(t.Context(), "exports"); err != nil || !slot.Acquired {
		t.Fatalf("Acquire: %+v, %v", slot, err)
	}
	kv := []string{"x-flow", "acme", "x-weight", "1"}
	for _, tc := range []struct {
		name     string
		deadline time.Duration // the client's; 0 for none
		flowWait time.Duration
		code     codes.Code
		bound    time.Duration
	}{
		{"a 100 ms deadline", 100 * time.Millisecond, time.Minute, codes.DeadlineExceeded, 100 * time.Millisecond},
		{"FlowWait 300 ms", 0, 300 * time.Millisecond, codes.ResourceExhausted, 300 * time.Millisecond},
	} {
		tm := &timed{}
		c := serveConcurrency(t, sem, &pglimitgrpc.Config{Key: oneKey, Flow: flowOf, FlowWait: tc.flowWait},
			func(context.Context, string) error { t.Error("the handler ran"); return nil }, tm.intercept)
		ctx := metadata.AppendToOutgoingContext(t.Context(), kv...)
		if tc.deadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, tc.deadline)
			defer cancel()
		}
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		if tc.code == codes.ResourceExhausted {
			wantBusy(t, tc.name, err)
		}
		var took time.Duration
		waitUntil(t, "the server's answer", func() bool {
			var calls int
			took, _, calls = tm.last()
			return calls == 1
		})
		// A client past its deadline also cancels the call: the server may
		// see either first.
		if _, code, _ := tm.last(); (code != tc.code && (tc.code != codes.DeadlineExceeded || code != codes.Canceled)) || took > tc.bound+answerSlack {
			t.Errorf("%s: the server answered %s after %s; want %s within %s", tc.name, code, took, tc.code, tc.bound+answerSlack)
		}
		if n := waitersOf(t, pool, schema); n != 0 {
			t.Errorf("%s: %d places left in the queue, want 0", tc.name, n)
		}
	}
}

// waitersOf counts the live places in schema's queue of semaphore waiters.
func waitersOf(t *testing.T, db pglimit.DB, schema string) int {
	t.Helper()
	var n int
	q := "SELECT count(*) FROM " + pgx.Identifier{schema, "pglimit_slot_waiters"}.Sanitize() + " WHERE expires_at > clock_timestamp()"
	if err := db.QueryRow(t.Context(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Inside a rate limit interceptor, a call the concurrency interceptor
// refuses is charged nothing by the limit outside, for unary calls and
// streams: the outer count keeps the first call's unit only.
func TestConcurrencyChainRefundsOuterLimit(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	countCfg := pglimit.Config{Schema: schema, Limits: []pglimit.Limit{{Name: "per-hour", Rate: 10, Period: time.Hour, Algorithm: pglimit.FixedWindow}}}
	count, err := pglimit.New(pool, &countCfg)
	if err != nil {
		t.Fatal(err)
	}
	byUser := &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("x-user")}
	outerUnary, err := pglimitgrpc.UnaryServerInterceptor(count, byUser)
	if err != nil {
		t.Fatal(err)
	}
	outerStream, err := pglimitgrpc.StreamServerInterceptor(count, byUser)
	if err != nil {
		t.Fatal(err)
	}
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 1})
	innerUnary, err := pglimitgrpc.UnaryServerConcurrency(sem, byUser)
	if err != nil {
		t.Fatal(err)
	}
	innerStream, err := pglimitgrpc.StreamServerConcurrency(sem, byUser)
	if err != nil {
		t.Fatal(err)
	}
	hold, inside, release := holding()
	c := serveChainOf(t, gated{Server: health.NewServer(), check: hold},
		[]grpc.UnaryServerInterceptor{outerUnary, innerUnary}, []grpc.StreamServerInterceptor{outerStream, innerStream})
	ctx := metadata.AppendToOutgoingContext(bounded(t), "x-user", "bob")
	first := call(ctx, c, "first")
	inside(t)
	_, err = c.Check(ctx, &healthpb.HealthCheckRequest{})
	wantBusy(t, "a second call", err)
	if got := left(t, pool, &countCfg, "bob"); got != 9 {
		t.Errorf("after the concurrency refusal: %d left of the outer count, want 9 (the first call's unit only)", got)
	}
	w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	wantBusy(t, "a stream", err)
	if got := left(t, pool, &countCfg, "bob"); got != 9 {
		t.Errorf("after the concurrency refused a stream: %d left of the outer count, want 9", got)
	}
	close(release)
	if err := <-first; err != nil {
		t.Errorf("the first call: %v", err)
	}
}

// Flow, FlowWait and Level are for the concurrency interceptors, which
// take neither Methods nor IDMetadata, and whose Flow and Level exclude
// each other.
func TestConcurrencyConfigErrors(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 1})
	lim := newLimiter(t, schema, pglimit.Config{Cooldown: time.Second})
	second := func(_ any, err error) error { return err }
	for name, err := range map[string]error{
		"nil semaphore":                      second(pglimitgrpc.UnaryServerConcurrency(nil, nil)),
		"Methods":                            second(pglimitgrpc.UnaryServerConcurrency(sem, &pglimitgrpc.Config{Methods: map[string]pglimit.Limiter{check: lim}})),
		"IDMetadata":                         second(pglimitgrpc.StreamServerConcurrency(sem, &pglimitgrpc.Config{IDMetadata: "idempotency-key"})),
		"Flow and Level":                     second(pglimitgrpc.UnaryServerConcurrency(sem, &pglimitgrpc.Config{Flow: flowOf, Level: levelOf})),
		"FlowWait without Flow":              second(pglimitgrpc.UnaryServerConcurrency(sem, &pglimitgrpc.Config{FlowWait: time.Second})),
		"negative FlowWait":                  second(pglimitgrpc.StreamServerConcurrency(sem, &pglimitgrpc.Config{Flow: flowOf, FlowWait: -1})),
		"bad OnError":                        second(pglimitgrpc.UnaryServerConcurrency(sem, &pglimitgrpc.Config{OnError: 42})),
		"Flow on a rate limit":               second(pglimitgrpc.UnaryServerInterceptor(lim, &pglimitgrpc.Config{Flow: flowOf})),
		"FlowWait on a rate limit":           second(pglimitgrpc.StreamServerInterceptor(lim, &pglimitgrpc.Config{FlowWait: time.Second})),
		"Level on levels of rate limits":     second(pglimitgrpc.UnaryServerLevels([]pglimitgrpc.Level{{Limiter: lim, Key: oneKey}}, &pglimitgrpc.Config{Level: levelOf})),
		"Level on a rate limit, for streams": second(pglimitgrpc.StreamServerLevels([]pglimitgrpc.Level{{Limiter: lim, Key: oneKey}}, &pglimitgrpc.Config{Level: levelOf})),
	} {
		if !errors.Is(err, pglimitgrpc.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// A semaphore whose database fails follows OnError: Unavailable with a
// RetryInfo by default, the handler without a slot for FailOpen, and a
// refusal marked RATE_LIMITER_UNAVAILABLE for FailClosed.
func TestConcurrencyOnError(t *testing.T) {
	t.Parallel()
	dead := testdb.Pool(t)
	sem := newSemaphore(t, dead, pglimitsem.Config{Schema: testdb.Schema(t), Slots: 1})
	dead.Close()
	ran := func(context.Context, string) error { return nil }
	for _, tc := range []struct {
		policy pglimitgrpc.ErrorPolicy
		code   codes.Code
	}{{pglimitgrpc.Unavailable, codes.Unavailable}, {pglimitgrpc.FailOpen, codes.OK}, {pglimitgrpc.FailClosed, codes.ResourceExhausted}} {
		c := serveConcurrency(t, sem, &pglimitgrpc.Config{Key: oneKey, OnError: tc.policy, Logger: slog.New(slog.DiscardHandler)}, ran)
		_, err := c.Check(bounded(t), &healthpb.HealthCheckRequest{})
		s := wantCode(t, tc.policy.String(), err, tc.code)
		if _, ok := pglimitgrpc.RetryDelay(err); tc.code != codes.OK && !ok {
			t.Errorf("%s: no RetryInfo in %v", tc.policy, err)
		}
		var reason string
		for _, det := range s.Details() {
			if ei, ok := det.(*errdetails.ErrorInfo); ok {
				reason = ei.Reason
			}
		}
		if want := map[bool]string{true: "RATE_LIMITER_UNAVAILABLE"}[tc.policy == pglimitgrpc.FailClosed]; reason != want {
			t.Errorf("%s: ErrorInfo reason %q, want %q", tc.policy, reason, want)
		}
	}
}
