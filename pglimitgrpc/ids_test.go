package pglimitgrpc_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimitgrpc"
)

// With IDMetadata, a retried call (same id) is charged once and passes
// as the first did, while a call with a new id is refused by the
// cooldown; an invalid id fails the call with InvalidArgument and
// charges nothing.
func TestIDMetadata(t *testing.T) {
	t.Parallel()
	lim := newLimiter(t, testdb.Schema(t), pglimit.Config{Cooldown: time.Hour})
	c := serve(t, lim, &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("x-user"), IDMetadata: "Idempotency-Key"})
	call := func(kv ...string) error {
		_, err := c.Check(metadata.AppendToOutgoingContext(t.Context(), append([]string{"x-user", "bob"}, kv...)...), &healthpb.HealthCheckRequest{})
		return err
	}
	wantCode(t, "an empty id", call("idempotency-key", ""), codes.InvalidArgument)
	wantCode(t, "an id too long", call("idempotency-key", strings.Repeat("i", pglimit.MaxIDLength+1)), codes.InvalidArgument)
	wantCode(t, "two ids", call("idempotency-key", "a", "idempotency-key", "b"), codes.InvalidArgument)
	for i := range 3 {
		if err := call("idempotency-key", "req-1"); err != nil {
			t.Fatalf("call %d with req-1: %v", i, err)
		}
	}
	wantCode(t, "a new id", call("idempotency-key", "req-2"), codes.ResourceExhausted)
	wantCode(t, "no id", call(), codes.ResourceExhausted)
}

// IDMetadata must be an application metadata key.
func TestIDMetadataConfig(t *testing.T) {
	t.Parallel()
	lim := newLimiter(t, testdb.Schema(t), pglimit.Config{Cooldown: time.Hour})
	for _, key := range []string{"grpc-id", "id-bin", "id key"} {
		if _, err := pglimitgrpc.UnaryServerInterceptor(lim, &pglimitgrpc.Config{IDMetadata: key}); !errors.Is(err, pglimitgrpc.ErrInvalidConfig) {
			t.Errorf("IDMetadata %q: %v, want ErrInvalidConfig", key, err)
		}
	}
}

// A call with an id that an interceptor inside fails is given back by
// its id: the outer limit keeps nothing, and a retry, replayed, takes
// nothing either.
func TestIDMetadataRefusedInside(t *testing.T) {
	t.Parallel()
	schema := testdb.Schema(t)
	outerLim := newLimiter(t, schema, pglimit.Config{Namespace: "outer", Limits: []pglimit.Limit{{Name: "outer", Rate: 3, Period: time.Hour, Burst: 3}}})
	innerLim := newLimiter(t, schema, pglimit.Config{Namespace: "inner", Cooldown: time.Hour})
	outer, err := pglimitgrpc.UnaryServerInterceptor(outerLim, &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("x-user"), IDMetadata: "idempotency-key"})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := pglimitgrpc.UnaryServerInterceptor(innerLim, &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("x-user")})
	if err != nil {
		t.Fatal(err)
	}
	c := serveChain(t, []grpc.UnaryServerInterceptor{outer, inner}, nil)
	if _, err := innerLim.Allow(t.Context(), "bob"); err != nil { // the inner cooldown is spent
		t.Fatal(err)
	}
	for i := range 2 {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-user", "bob", "idempotency-key", "order-1")
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		wantCode(t, "refused inside", err, codes.ResourceExhausted)
		if d, err := outerLim.Peek(t.Context(), "bob", 1); err != nil || d.Remaining != 2 {
			t.Fatalf("after call %d the outer limit has %d left after one more (%v), want 2: its charge was not given back", i, d.Remaining, err)
		}
	}
}

// With the Levels interceptors the id is the call's at every level: a
// retry is charged at none, and a call an interceptor inside fails is
// given back at every level by its id.
func TestIDMetadataLevels(t *testing.T) {
	t.Parallel()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t) // the levels of one decision share a pool
	level := func(name string) pglimit.Limiter {
		lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: name, Limits: []pglimit.Limit{{Name: name, Rate: 4, Period: time.Hour, Burst: 4}}})
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}
	org, user := level("org"), level("user")
	innerLim := newLimiter(t, schema, pglimit.Config{Namespace: "inner", Limits: []pglimit.Limit{{Name: "inner", Rate: 1, Period: time.Hour, Burst: 1}}})
	levels, err := pglimitgrpc.UnaryServerLevels([]pglimitgrpc.Level{
		{Limiter: org, Key: pglimitgrpc.Metadata("x-org")},
		{Limiter: user, Key: pglimitgrpc.Metadata("x-user")},
	}, &pglimitgrpc.Config{IDMetadata: "idempotency-key"})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := pglimitgrpc.UnaryServerInterceptor(innerLim, &pglimitgrpc.Config{Key: pglimitgrpc.Metadata("x-org"), IDMetadata: "idempotency-key"})
	if err != nil {
		t.Fatal(err)
	}
	c := serveChain(t, []grpc.UnaryServerInterceptor{levels, inner}, nil)
	call := func(id string) error {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-org", "acme", "x-user", "bob", "idempotency-key", id)
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	for i := range 3 {
		if err := call("req-1"); err != nil {
			t.Fatalf("call %d with req-1: %v", i, err)
		}
	}
	// req-1 spent the inner limit: req-2 is refused inside, and given back.
	for i := range 2 {
		wantCode(t, "req-2, refused inside", call("req-2"), codes.ResourceExhausted)
		for _, lv := range []struct {
			lim pglimit.Limiter
			key string
		}{{org, "acme"}, {user, "bob"}} {
			if d, err := lv.lim.Peek(t.Context(), lv.key, 1); err != nil || !d.Allowed || d.Remaining != 2 {
				t.Fatalf("after req-2's call %d, %s has %d left after one more (%v), want 2: req-1 charged once, req-2 given back", i, lv.key, d.Remaining, err)
			}
		}
	}
	wantCode(t, "an id too long", call(strings.Repeat("i", pglimit.MaxIDLength+1)), codes.InvalidArgument)
}
