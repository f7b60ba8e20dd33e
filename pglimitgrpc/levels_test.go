package pglimitgrpc_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimitgrpc"
)

// A call passes only if its org and its user both admit it; a refusal
// names the limit of the level that refused, and charges the other
// nothing.
func TestLevels(t *testing.T) {
	t.Parallel()
	schema := testdb.Schema(t)
	orgCfg := pglimit.Config{Schema: schema, Namespace: "org", Limits: []pglimit.Limit{{Name: "org", Rate: 3, Period: time.Hour, Burst: 3}}}
	// The levels of one decision share a pool.
	pool := testdb.Pool(t)
	org, err := pglimit.New(pool, &orgCfg)
	if err != nil {
		t.Fatal(err)
	}
	user, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "user", Limits: []pglimit.Limit{{Name: "user", Rate: 2, Period: time.Hour, Burst: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	levels := []pglimitgrpc.Level{{Limiter: org, Key: pglimitgrpc.Metadata("x-org")}, {Limiter: user, Key: pglimitgrpc.Metadata("x-user")}}
	unary, err := pglimitgrpc.UnaryServerLevels(levels, nil)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := pglimitgrpc.StreamServerLevels(levels, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	healthpb.RegisterHealthServer(srv, health.NewServer())
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
	c := healthpb.NewHealthClient(conn)
	call := func(user string) error {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-org", "acme", "x-user", user)
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	violated := func(err error) string {
		t.Helper()
		s := wantCode(t, "a refused call", err, codes.ResourceExhausted)
		for _, det := range s.Details() {
			if q, ok := det.(*errdetails.QuotaFailure); ok && len(q.Violations) == 1 {
				return q.Violations[0].Subject
			}
		}
		t.Fatalf("no single QuotaFailure violation in %v", s.Details())
		return ""
	}

	for range 2 {
		if err := call("bob"); err != nil {
			t.Fatalf("bob: %v", err)
		}
	}
	if v := violated(call("bob")); v != "limit:user" {
		t.Fatalf("bob past his limit: %s, want limit:user", v)
	}
	st, err := pglimit.Inspect(context.Background(), testdb.Limiter(t, testdb.Pool(t), &orgCfg), "acme")
	if err != nil || st.Limits[0].Remaining != 1 {
		t.Fatalf("the org after bob's refusal: %+v, %v; want 1 left", st, err)
	}
	if err := call("carol"); err != nil {
		t.Fatalf("carol, the org's last unit: %v", err)
	}
	if v := violated(call("dave")); v != "limit:org" {
		t.Errorf("dave in a spent org: %s, want limit:org", v)
	}
	if _, err := c.Check(t.Context(), &healthpb.HealthCheckRequest{}); err == nil {
		t.Error("a call without keys passed")
	}

	for name, cfg := range map[string]*pglimitgrpc.Config{
		"Config.Key":     {Key: pglimitgrpc.PeerAddress},
		"Config.Methods": {Methods: map[string]pglimit.Limiter{"/a.B/C": org}},
	} {
		if _, err := pglimitgrpc.UnaryServerLevels(levels, cfg); !errors.Is(err, pglimitgrpc.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := pglimitgrpc.UnaryServerLevels(nil, nil); !errors.Is(err, pglimitgrpc.ErrInvalidConfig) {
		t.Errorf("no levels: %v, want ErrInvalidConfig", err)
	}
}
