package pglimitgrpc_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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

func TestMain(m *testing.M) { testdb.Main(m) }

const (
	check = "/grpc.health.v1.Health/Check"
	watch = "/grpc.health.v1.Health/Watch"
	list  = "/grpc.health.v1.Health/List"
)

// newLimiter is a limiter of cfg (Schema filled in) on the test server.
func newLimiter(t *testing.T, schema string, cfg pglimit.Config) pglimit.Limiter {
	t.Helper()
	cfg.Schema = schema
	lim, err := pglimit.New(testdb.Pool(t), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// serve runs gRPC's health service on 127.0.0.1 behind both interceptors
// of lim and cfg, and returns a client of it.
func serve(t *testing.T, lim pglimit.Limiter, cfg *pglimitgrpc.Config, dial ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	return serveWith(t, lim, cfg, nil, dial...)
}

// serveWith is serve with server options, and dial options that may
// replace the client's insecure credentials.
func serveWith(t *testing.T, lim pglimit.Limiter, cfg *pglimitgrpc.Config, opts []grpc.ServerOption, dial ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	unary, err := pglimitgrpc.UnaryServerInterceptor(lim, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := pglimitgrpc.StreamServerInterceptor(lim, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append(opts, grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln) //nolint:errcheck // Stop ends it
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func wantCode(t *testing.T, what string, err error, code codes.Code) *status.Status {
	t.Helper()
	s, _ := status.FromError(err)
	if s.Code() != code {
		t.Fatalf("%s: %v; want %s", what, err, code)
	}
	return s
}

// A refusal is ResourceExhausted with the wait in a RetryInfo and in the
// trailer gRPC's retries read, and the limit in a QuotaFailure.
func TestUnaryRefusal(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := serve(t, newLimiter(t, testdb.Schema(t), pglimit.Config{Cooldown: time.Hour}), nil)
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("first call: %v", err)
	}
	var trailer metadata.MD
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	s := wantCode(t, "second call", err, codes.ResourceExhausted)
	d, ok := pglimitgrpc.RetryDelay(err)
	if !ok || d <= 59*time.Minute || d > time.Hour {
		t.Errorf("RetryInfo %s, %t; want within (59m, 1h]", d, ok)
	}
	var quota *errdetails.QuotaFailure
	for _, det := range s.Details() {
		if q, ok := det.(*errdetails.QuotaFailure); ok {
			quota = q
		}
	}
	if quota == nil || len(quota.Violations) != 1 || quota.Violations[0].Subject != "limit:cooldown" {
		t.Errorf("QuotaFailure %v; want one violation of limit:cooldown", quota)
	}
	ms, err := strconv.ParseInt(strings.Join(trailer.Get("grpc-retry-pushback-ms"), ""), 10, 64)
	if err != nil || time.Duration(ms)*time.Millisecond != d.Truncate(time.Millisecond) {
		t.Errorf("grpc-retry-pushback-ms %v (%v); want %s", trailer.Get("grpc-retry-pushback-ms"), err, d)
	}
}

// A stream is decided when it opens.
func TestStream(t *testing.T) {
	t.Parallel()
	c := serve(t, newLimiter(t, testdb.Schema(t), pglimit.Config{Cooldown: time.Hour}), nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	first, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := first.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first stream: %v, %v", r, err)
	}
	second, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = second.Recv()
	wantCode(t, "second stream", err, codes.ResourceExhausted)
	if d, ok := pglimitgrpc.RetryDelay(err); !ok || d <= 59*time.Minute {
		t.Errorf("RetryInfo %s, %t", d, ok)
	}
}

// A client that waits as RetryInfo says is admitted on its next call, and
// so is one whose gRPC retry policy reads the pushback trailer.
func TestClientHonoursRetryDelay(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const cooldown = time.Second
	schema := testdb.Schema(t)

	c := serve(t, newLimiter(t, schema, pglimit.Config{Cooldown: cooldown}), nil)
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
	d, ok := pglimitgrpc.RetryDelay(err)
	if !ok {
		t.Fatalf("no RetryInfo in %v", err)
	}
	time.Sleep(d)
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("after waiting %s as told: %v", d, err)
	}

	retrying := serve(t, newLimiter(t, schema, pglimit.Config{Cooldown: cooldown, Namespace: "retrying"}), nil,
		grpc.WithDefaultServiceConfig(`{"methodConfig": [{"name": [{"service": "grpc.health.v1.Health"}],
			"retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
			"retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}]}`))
	if _, err := retrying.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := retrying.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("a client retrying on RESOURCE_EXHAUSTED: %v", err)
	}
	// Its backoff is 10 ms: only the pushback made it wait for the cooldown.
	if took := time.Since(start); took < cooldown/2 {
		t.Errorf("the retried call took %s; the pushback asked for up to %s", took, cooldown)
	}
}

// Methods can have limiters of their own, or none.
func TestPerMethodAndExempt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	schema := testdb.Schema(t)
	watches := newLimiter(t, schema, pglimit.Config{Cooldown: time.Hour, Namespace: "watch"})
	c := serve(t, newLimiter(t, schema, pglimit.Config{Cooldown: time.Hour}), &pglimitgrpc.Config{
		Methods: map[string]pglimit.Limiter{watch: watches},
		Exempt:  []string{list},
	})
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
	wantCode(t, "second Check", err, codes.ResourceExhausted)
	s, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	if err != nil {
		t.Fatalf("Watch, under a limiter of its own: %v", err)
	}
	for range 3 {
		if _, err := c.List(ctx, &healthpb.HealthListRequest{}); err != nil {
			t.Fatalf("exempt List: %v", err)
		}
	}
	if p, err := watches.Peek(ctx, "127.0.0.1", 1); err != nil || p.Allowed {
		t.Errorf("Watch's limiter: %+v, %v; want the key used", p, err)
	}
}

// The default key is the peer's address: metadata a client writes, as a
// proxy's forwarding headers, changes nothing.
func TestDefaultKeyIgnoresMetadata(t *testing.T) {
	t.Parallel()
	c := serve(t, newLimiter(t, testdb.Schema(t), pglimit.Config{Cooldown: time.Hour}), nil)
	for i, ip := range []string{"10.0.0.1", "10.0.0.2"} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-forwarded-for", ip, "x-real-ip", ip, "forwarded", "for="+ip)
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		if i == 0 && err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			wantCode(t, "a call claiming another address", err, codes.ResourceExhausted)
		}
	}
}

// A key from metadata: missing or not a valid key, the call is
// InvalidArgument and consumes nothing.
func TestMetadataKey(t *testing.T) {
	t.Parallel()
	lim := newLimiter(t, testdb.Schema(t), pglimit.Config{Cooldown: time.Hour})
	c := serve(t, lim, &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("X-API-Key")})
	call := func(kv ...string) error {
		_, err := c.Check(metadata.AppendToOutgoingContext(t.Context(), kv...), &healthpb.HealthCheckRequest{})
		return err
	}
	wantCode(t, "no key", call(), codes.InvalidArgument)
	wantCode(t, "an empty key", call("x-api-key", ""), codes.InvalidArgument)
	wantCode(t, "a key too long", call("x-api-key", strings.Repeat("k", pglimit.MaxKeyLength+1)), codes.InvalidArgument)
	// The first value is the key: a second one cannot stand in for it.
	wantCode(t, "an empty key, then another", call("x-api-key", "", "x-api-key", "tenant-a"), codes.InvalidArgument)
	if err := call("x-api-key", "tenant-a"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "tenant-a again", call("x-api-key", "tenant-a"), codes.ResourceExhausted)
	if err := call("x-api-key", "tenant-b"); err != nil {
		t.Fatal(err)
	}
}

// A limiter that cannot decide: Unavailable with a RetryInfo by default,
// the call through with FailOpen, ResourceExhausted with an ErrorInfo with
// FailClosed.
func TestLimiterFailure(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: testdb.Schema(t), Cooldown: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	pool.Close() // every decision now fails
	for _, tc := range []struct {
		policy pglimitgrpc.ErrorPolicy
		code   codes.Code
	}{
		{pglimitgrpc.Unavailable, codes.Unavailable},
		{pglimitgrpc.FailOpen, codes.OK},
		{pglimitgrpc.FailClosed, codes.ResourceExhausted},
	} {
		c := serve(t, lim, &pglimitgrpc.Config{OnError: tc.policy})
		_, err := c.Check(t.Context(), &healthpb.HealthCheckRequest{})
		s := wantCode(t, tc.policy.String(), err, tc.code)
		if strings.Contains(s.Message(), "closed pool") {
			t.Errorf("%s: the client is told the cause: %s", tc.policy, s.Message())
		}
		d, ok := pglimitgrpc.RetryDelay(err)
		switch tc.policy {
		case pglimitgrpc.Unavailable:
			if !ok || d != time.Minute {
				t.Errorf("unavailable: RetryInfo %s, %t; want the shortest interval, 1m", d, ok)
			}
		case pglimitgrpc.FailClosed:
			var info *errdetails.ErrorInfo
			for _, det := range s.Details() {
				if i, ok := det.(*errdetails.ErrorInfo); ok {
					info = i
				}
			}
			if !ok || d != time.Minute || info.GetReason() != "RATE_LIMITER_UNAVAILABLE" {
				t.Errorf("fail-closed: RetryInfo %s, %t, ErrorInfo %v", d, ok, info)
			}
		}
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	lim := newLimiter(t, testdb.Schema(t), pglimit.Config{Cooldown: time.Second})
	for name, cfg := range map[string]*pglimitgrpc.Config{
		"method name":    {Methods: map[string]pglimit.Limiter{"Check": lim}},
		"nil limiter":    {Methods: map[string]pglimit.Limiter{check: nil}},
		"exempt name":    {Exempt: []string{"grpc.health.v1.Health/Check"}},
		"too many parts": {Exempt: []string{"/a/b/c"}},
		"policy":         {OnError: 7},
	} {
		if _, err := pglimitgrpc.UnaryServerInterceptor(lim, cfg); !errors.Is(err, pglimitgrpc.ErrInvalidConfig) {
			t.Errorf("%s: %v; want ErrInvalidConfig", name, err)
		}
	}
	if _, err := pglimitgrpc.StreamServerInterceptor(nil, nil); !errors.Is(err, pglimitgrpc.ErrInvalidConfig) {
		t.Errorf("nil limiter: %v; want ErrInvalidConfig", err)
	}
}

// recorder collects the events OnDecision reports.
type recorder struct {
	mu     sync.Mutex
	events []pglimitgrpc.Event
}

func (r *recorder) record(_ context.Context, ev pglimitgrpc.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
}

// take returns the events so far, and forgets them.
func (r *recorder) take() []pglimitgrpc.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// OnDecision sees every call once, with the outcome the call got, in the
// words pglimithttp and the metrics use.
func TestOnDecision(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	schema := testdb.Schema(t)
	var rec recorder
	c := serve(t, newLimiter(t, schema, pglimit.Config{Cooldown: time.Hour}), &pglimitgrpc.Config{
		Exempt:     []string{list},
		OnDecision: rec.record,
	})
	_, _ = c.Check(ctx, &healthpb.HealthCheckRequest{})
	_, _ = c.Check(ctx, &healthpb.HealthCheckRequest{})
	_, _ = c.List(ctx, &healthpb.HealthListRequest{})
	want := []pglimitgrpc.Outcome{pglimitgrpc.OutcomeAdmitted, pglimitgrpc.OutcomeRefused, pglimitgrpc.OutcomeExempt}
	got := rec.take()
	if len(got) != len(want) {
		t.Fatalf("%d events %+v, want %d", len(got), got, len(want))
	}
	for i, ev := range got {
		if ev.Outcome != want[i] {
			t.Errorf("event %d: outcome %q, want %q", i, ev.Outcome, want[i])
		}
	}
	if ev := got[1]; ev.Method != check || ev.Key != "127.0.0.1" || ev.Decision.Allowed || ev.Decision.RetryAfter <= 0 {
		t.Errorf("the refusal's event: %+v", ev)
	}

	shadow := newLimiter(t, schema, pglimit.Config{Cooldown: time.Hour, Namespace: "shadow", Shadow: true})
	bad := func(context.Context, string) (string, error) { return "", errors.New("no tenant") }
	for _, tc := range []struct {
		name string
		lim  pglimit.Limiter
		cfg  pglimitgrpc.Config
		want pglimitgrpc.Outcome
	}{
		{"shadow", shadow, pglimitgrpc.Config{}, pglimitgrpc.OutcomeShadowed},
		{"bad key", shadow, pglimitgrpc.Config{Key: bad}, pglimitgrpc.OutcomeBadKey},
	} {
		tc.cfg.OnDecision = rec.record
		c := serve(t, tc.lim, &tc.cfg)
		_, _ = c.Check(ctx, &healthpb.HealthCheckRequest{})
		_, _ = c.Check(ctx, &healthpb.HealthCheckRequest{})
		got := rec.take()
		if len(got) != 2 || got[1].Outcome != tc.want {
			t.Errorf("%s: events %+v, want the second %q", tc.name, got, tc.want)
		}
	}

	pool := testdb.Pool(t)
	failing, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Cooldown: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	pool.Close() // every decision now fails
	for policy, want := range map[pglimitgrpc.ErrorPolicy]pglimitgrpc.Outcome{
		pglimitgrpc.Unavailable: pglimitgrpc.OutcomeUnavailable,
		pglimitgrpc.FailOpen:    pglimitgrpc.OutcomeFailOpen,
		pglimitgrpc.FailClosed:  pglimitgrpc.OutcomeFailClosed,
	} {
		c := serve(t, failing, &pglimitgrpc.Config{OnError: policy, OnDecision: rec.record})
		_, _ = c.Check(ctx, &healthpb.HealthCheckRequest{})
		got := rec.take()
		if len(got) != 1 || got[0].Outcome != want || got[0].Err == nil {
			t.Errorf("%s: events %+v, want one %q with the error", policy, got, want)
		}
	}
}
