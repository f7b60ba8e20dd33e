package pglimitgrpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimitgrpc"
)

// answerSlack is the stated bound past the limiter's Timeout within which
// a call whose decision cannot finish is answered: the time to hear the
// server's error or to give up on the connection, and room for a loaded
// machine.
const answerSlack = 500 * time.Millisecond

const faultTimeout = 200 * time.Millisecond

// faultLimits are the limits of the tests' limiter: a key has room left, so
// that a decision waits for a locked row rather than being refused by
// reading it; the shortest interval between two units is 36 s.
var faultLimits = []pglimit.Limit{{Name: "hourly", Rate: 100, Period: time.Hour, Burst: 100}}

// faultClient serves gRPC's health service on 127.0.0.1 behind the
// interceptors of a limiter of faultLimits on pool, keyed by the
// metadata key, and returns a function that calls Check with value under
// key, and the events.
func faultClient(t *testing.T, pool *pgxpool.Pool, schema, key string) (call func(value string) error, events *recorder) {
	t.Helper()
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Timeout: faultTimeout, Limits: faultLimits})
	if err != nil {
		t.Fatal(err)
	}
	events = &recorder{}
	c := serve(t, lim, &pglimitgrpc.Config{Key: pglimitgrpc.Metadata(key), OnDecision: events.record})
	return func(value string) error {
		ctx := metadata.AppendToOutgoingContext(t.Context(), key, value)
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}, events
}

// A call whose decision cannot finish, on a key whose row a long
// transaction holds or on connections gone silent, is answered within the
// limiter's Timeout plus answerSlack with the documented failure answer:
// Unavailable with a RetryInfo of the shortest interval between two units,
// the event saying why (ErrTimeout).
func TestFaultAnsweredWithinTimeout(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"locked row", "stalled connection"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			schema := testdb.Schema(t)
			pool := testdb.Pool(t)
			var proxy *testdb.StallProxy
			if fault != "locked row" {
				proxy, pool = testdb.StallPool(t)
			}
			call, events := faultClient(t, pool, schema, "x-user")
			if err := call("alice"); err != nil {
				t.Fatalf("before the fault: %v", err)
			}
			if proxy != nil {
				proxy.Stall()
				t.Cleanup(proxy.Unstall)
			} else {
				testdb.Lock(t, testdb.Pool(t), schema, "pglimit_upsert", "alice")
			}
			start := time.Now()
			err := call("alice")
			if took := time.Since(start); took > faultTimeout+answerSlack {
				t.Errorf("answered after %s; Timeout %s", took.Round(time.Millisecond), faultTimeout)
			}
			wantCode(t, fault, err, codes.Unavailable)
			if d, ok := pglimitgrpc.RetryDelay(err); !ok || d != 36*time.Second {
				t.Errorf("RetryInfo %s, %t; want 36s", d, ok)
			}
			evs := events.take()
			if ev := evs[len(evs)-1]; ev.Outcome != pglimitgrpc.OutcomeUnavailable || !errors.Is(ev.Err, pglimit.ErrTimeout) {
				t.Errorf("event %+v, want OutcomeUnavailable with ErrTimeout", ev)
			}
		})
	}
}

// A key that pglimit would reject (empty, 300 bytes, not UTF-8, a NUL),
// read from metadata, fails the call with the documented InvalidArgument
// and consumes nothing: the table is as it was. Binary metadata (a -bin
// key) carries the bytes that text metadata cannot.
func TestBadMetadataKeyInvalidArgument(t *testing.T) {
	t.Parallel()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	text, textEvents := faultClient(t, pool, schema, "x-user")
	binary, binaryEvents := faultClient(t, pool, schema, "x-user-bin")
	if err := text("alice"); err != nil {
		t.Fatal(err)
	}
	if err := binary("bob"); err != nil {
		t.Fatal(err)
	}
	before := upsertRows(t, pool, schema)
	for _, c := range []struct {
		name   string
		call   func(string) error
		events *recorder
		key    string
	}{
		{"empty", text, textEvents, ""},
		{"300 bytes", text, textEvents, strings.Repeat("k", 300)},
		{"not UTF-8", binary, binaryEvents, "\xff"},
		{"cut UTF-8", binary, binaryEvents, "caf\xc3"},
		{"NUL", binary, binaryEvents, "a\x00b"},
	} {
		err := c.call(c.key)
		wantCode(t, c.name, err, codes.InvalidArgument)
		evs := c.events.take()
		if ev := evs[len(evs)-1]; ev.Outcome != pglimitgrpc.OutcomeBadKey {
			t.Errorf("%s: event %+v, want OutcomeBadKey", c.name, ev)
		}
	}
	if after := upsertRows(t, pool, schema); after != before {
		t.Errorf("bad keys changed the table:\nbefore %s\nafter  %s", before, after)
	}
}

// upsertRows is every row of the Upsert table in schema, as text.
func upsertRows(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	var s string
	q := "SELECT coalesce(string_agg(t::text, ' ' ORDER BY t::text), '') FROM " + pgx.Identifier{schema, "pglimit_upsert"}.Sanitize() + " AS t"
	if err := pool.QueryRow(context.Background(), q).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}
