package pglimitgrpc_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimitgrpc"
)

// serveChain runs gRPC's health service on 127.0.0.1 behind the unary
// and stream interceptors given, chained outermost first, and returns a
// client of it.
func serveChain(t *testing.T, unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) healthpb.HealthClient {
	t.Helper()
	return serveChainOf(t, health.NewServer(), unary, stream)
}

// serveChainOf is serveChain with svc as the health service.
func serveChainOf(t *testing.T, svc healthpb.HealthServer, unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor) healthpb.HealthClient {
	t.Helper()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...))
	healthpb.RegisterHealthServer(srv, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln) //nolint:errcheck // Stop ends it
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// left is how many units key has left of the first limit of cfg's
// limiter, as the database of pool holds them.
func left(t *testing.T, pool *pgxpool.Pool, cfg *pglimit.Config, key string) int {
	t.Helper()
	st, err := pglimit.Inspect(context.Background(), testdb.Limiter(t, pool, cfg), key)
	if err != nil {
		t.Fatal(err)
	}
	return st.Limits[0].Remaining
}

// The composition of issue 45, item 15, over gRPC: counts per org and
// per user through UnaryServerLevels and StreamServerLevels, chained
// around a cooldown per API key through the plain interceptors, on a
// real server and client on loopback. A call the inner interceptor fails
// itself (ResourceExhausted past the cooldown, InvalidArgument without a
// key) leaves the outer counts as they were, for unary calls and
// streams, and its status names the inner limit alone. The handler's own
// ResourceExhausted is no refusal: it counts.
func TestChainRefusedInsideChargesNothingOutside(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Pool(t), testdb.Schema(t)
	orgCfg := pglimit.Config{Schema: schema, Namespace: "org", Limits: []pglimit.Limit{{Name: "org-day", Rate: 1000, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow}}}
	day := pglimit.PerDay(100)
	day.Name = "per-day"
	userCfg := pglimit.Config{Schema: schema, Namespace: "user", Limits: []pglimit.Limit{day}}
	keyCfg := pglimit.Config{Schema: schema, Namespace: "key", Cooldown: time.Hour}
	var lims []pglimit.Limiter
	for _, cfg := range []*pglimit.Config{&orgCfg, &userCfg, &keyCfg} {
		lim, err := pglimit.New(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		lims = append(lims, lim)
	}
	levels := []pglimitgrpc.Level{
		{Limiter: lims[0], Key: pglimitgrpc.Metadata("x-org")},
		{Limiter: lims[1], Key: pglimitgrpc.Metadata("x-user")},
	}
	outerUnary, err := pglimitgrpc.UnaryServerLevels(levels, nil)
	if err != nil {
		t.Fatal(err)
	}
	outerStream, err := pglimitgrpc.StreamServerLevels(levels, nil)
	if err != nil {
		t.Fatal(err)
	}
	keyed := &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("x-key")}
	innerUnary, err := pglimitgrpc.UnaryServerInterceptor(lims[2], keyed)
	if err != nil {
		t.Fatal(err)
	}
	innerStream, err := pglimitgrpc.StreamServerInterceptor(lims[2], keyed)
	if err != nil {
		t.Fatal(err)
	}
	// The application's own ResourceExhausted, no limiter's.
	busy := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("x-busy")) > 0 {
			return nil, status.Error(codes.ResourceExhausted, "the application is busy")
		}
		return handler(ctx, req)
	}
	c := serveChain(t, []grpc.UnaryServerInterceptor{outerUnary, innerUnary, busy}, []grpc.StreamServerInterceptor{outerStream, innerStream})
	callCtx := func(ctx context.Context, kv ...string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, append([]string{"x-org", "acme", "x-user", "bob"}, kv...)...)
	}
	counts := func(when string, org, user int) {
		t.Helper()
		if got := [2]int{left(t, pool, &orgCfg, "acme"), left(t, pool, &userCfg, "bob")}; got != [2]int{org, user} {
			t.Errorf("%s: org-day and per-day have %v left, want %v", when, got, [2]int{org, user})
		}
	}

	if _, err := c.Check(callCtx(t.Context(), "x-key", "k1"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("the first call: %v", err)
	}
	counts("admitted", 999, 99)

	var trailer metadata.MD
	_, err = c.Check(callCtx(t.Context(), "x-key", "k1"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	s := wantCode(t, "past the inner cooldown", err, codes.ResourceExhausted)
	counts("after the inner cooldown's ResourceExhausted", 999, 99)
	var subjects []string
	for _, det := range s.Details() {
		if q, ok := det.(*errdetails.QuotaFailure); ok {
			for _, v := range q.Violations {
				subjects = append(subjects, v.Subject)
			}
		}
	}
	if strings.Join(subjects, " ") != "limit:cooldown" || len(trailer.Get("grpc-retry-pushback-ms")) != 1 {
		t.Errorf("the inner refusal: QuotaFailure %v, pushback %v; want limit:cooldown alone and one pushback",
			subjects, trailer.Get("grpc-retry-pushback-ms"))
	}

	_, err = c.Check(callCtx(t.Context()), &healthpb.HealthCheckRequest{})
	wantCode(t, "no x-key", err, codes.InvalidArgument)
	counts("after the inner InvalidArgument", 999, 99)

	_, err = c.Check(callCtx(t.Context(), "x-key", "k2", "x-busy", "1"), &healthpb.HealthCheckRequest{})
	if s := wantCode(t, "the application's ResourceExhausted", err, codes.ResourceExhausted); s.Message() != "the application is busy" {
		t.Fatalf("the application's ResourceExhausted: %v", err)
	}
	counts("after the application's ResourceExhausted", 998, 98)

	watch := func(key string) error {
		ctx, cancel := context.WithCancel(callCtx(t.Context(), "x-key", key))
		defer cancel()
		w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		_, err = w.Recv()
		return err
	}
	if err := watch("k3"); err != nil {
		t.Fatalf("the first stream: %v", err)
	}
	counts("a stream admitted", 997, 97)
	wantCode(t, "a stream past the inner cooldown", watch("k3"), codes.ResourceExhausted)
	counts("after the inner cooldown refused a stream", 997, 97)
}

// An inner limiter whose database is down fails the call with
// Unavailable: the outer count is given back, for a unary call and for a
// stream.
func TestChainOutageInsideChargesNothingOutside(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	countCfg := pglimit.Config{Schema: testdb.Schema(t), Limits: []pglimit.Limit{{Name: "per-hour", Rate: 10, Period: time.Hour, Algorithm: pglimit.FixedWindow}}}
	count, err := pglimit.New(pool, &countCfg)
	if err != nil {
		t.Fatal(err)
	}
	deadPool := testdb.Pool(t)
	down, err := pglimit.New(deadPool, &pglimit.Config{Schema: testdb.Schema(t), Cooldown: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	deadPool.Close() // every decision of down now fails
	byUser := &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("x-user")}
	quiet := &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("x-user"), Logger: slog.New(slog.DiscardHandler)}
	var unary []grpc.UnaryServerInterceptor
	var stream []grpc.StreamServerInterceptor
	for _, lc := range []struct {
		lim pglimit.Limiter
		cfg *pglimitgrpc.Config
	}{{count, byUser}, {down, quiet}} {
		u, err := pglimitgrpc.UnaryServerInterceptor(lc.lim, lc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		s, err := pglimitgrpc.StreamServerInterceptor(lc.lim, lc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		unary, stream = append(unary, u), append(stream, s)
	}
	c := serveChain(t, unary, stream)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-user", "bob")
	_, err = c.Check(ctx, &healthpb.HealthCheckRequest{})
	wantCode(t, "the inner limiter down", err, codes.Unavailable)
	if got := left(t, pool, &countCfg, "bob"); got != 10 {
		t.Errorf("after the inner Unavailable: %d left of the outer count, want 10", got)
	}
	w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	wantCode(t, "a stream, the inner limiter down", err, codes.Unavailable)
	if got := left(t, pool, &countCfg, "bob"); got != 10 {
		t.Errorf("after the inner Unavailable of a stream: %d left of the outer count, want 10", got)
	}
}

// syncBuffer is a log the server's goroutines write and the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A refund the outer limiter cannot make (Range has no Refund) keeps its
// unit charged and is logged: the next call meets the outer cooldown.
func TestChainRefundFailureLogged(t *testing.T) {
	t.Parallel()
	cooldown, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: testdb.Schema(t), Strategy: pglimit.Range, Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var log syncBuffer
	outer, err := pglimitgrpc.UnaryServerInterceptor(cooldown, &pglimitgrpc.Config{
		Key:    pglimitgrpc.Metadata("x-user"),
		Logger: slog.New(slog.NewTextHandler(&log, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	// The inner interceptor fails the call with InvalidArgument: it has
	// no x-key.
	inner, err := pglimitgrpc.UnaryServerInterceptor(cooldown, &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("x-key")})
	if err != nil {
		t.Fatal(err)
	}
	c := serveChain(t, []grpc.UnaryServerInterceptor{outer, inner}, nil)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-user", "bob")
	_, err = c.Check(ctx, &healthpb.HealthCheckRequest{})
	wantCode(t, "no x-key", err, codes.InvalidArgument)
	if !strings.Contains(log.String(), "refund of 1 units of a call refused inside") || !strings.Contains(log.String(), "range strategy") {
		t.Errorf("the log after a refund Range cannot make: %q", log.String())
	}
	_, err = c.Check(ctx, &healthpb.HealthCheckRequest{})
	wantCode(t, "the next call", err, codes.ResourceExhausted)
}

// A client that gives up while an inner limiter decides (its key's row
// locked) leaves the outer count as it was: the inner interceptor fails
// the call as canceled, and the outer one refunds its unit although the
// client is gone. The client does not wait for the refund, so the test
// waits for the count, up to a bound far past one statement.
func TestChainClientGoneInsideChargesNothingOutside(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	countCfg := pglimit.Config{Schema: testdb.Schema(t), Limits: []pglimit.Limit{{Name: "per-hour", Rate: 10, Period: time.Hour, Algorithm: pglimit.FixedWindow}}}
	count, err := pglimit.New(pool, &countCfg)
	if err != nil {
		t.Fatal(err)
	}
	innerSchema := testdb.Schema(t)
	slow, err := pglimit.New(pool, &pglimit.Config{Schema: innerSchema, Timeout: time.Minute, Limits: faultLimits})
	if err != nil {
		t.Fatal(err)
	}
	byUser := &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("x-user")}
	outer, err := pglimitgrpc.UnaryServerInterceptor(count, byUser)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := pglimitgrpc.UnaryServerInterceptor(slow, byUser)
	if err != nil {
		t.Fatal(err)
	}
	c := serveChain(t, []grpc.UnaryServerInterceptor{outer, inner}, nil)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-user", "bob")
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("the first call: %v", err)
	}
	testdb.Lock(t, pool, innerSchema, "pglimit_upsert", "bob")
	// waitFor polls until bob has n left of the outer count, or a bound
	// far past one statement has passed.
	waitFor := func(n int) {
		for deadline := time.Now().Add(10 * time.Second); left(t, pool, &countCfg, "bob") != n && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
	}
	gone, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Check(gone, &healthpb.HealthCheckRequest{})
		errc <- err
	}()
	waitFor(8) // the outer interceptor took its unit: the inner one waits for the row
	cancel()
	wantCode(t, "a client giving up", <-errc, codes.Canceled)
	waitFor(9)
	if got := left(t, pool, &countCfg, "bob"); got != 9 {
		t.Errorf("after a client gave up inside: %d left of the outer count, want 9 (the first call's unit only)", got)
	}
}
