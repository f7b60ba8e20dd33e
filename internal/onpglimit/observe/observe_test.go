package observe_test

import (
	"context"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/observe"
	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Every call of an observed limiter is seen once, with its method and the
// outcome word its result means.
func TestOutcomes(t *testing.T) {
	t.Parallel()
	lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: testdb.Schema(t), Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var calls []*observe.Call
	observed := observe.Limiter(lim, func(ctx context.Context, op string) (context.Context, func(*observe.Call)) {
		return ctx, func(c *observe.Call) { calls = append(calls, c) }
	})
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, _ = observed.Allow(ctx, "k")
	_, _ = observed.Allow(ctx, "k")
	_, _ = observed.Allow(ctx, "")
	_, _ = observed.Allow(cancelled, "other")
	_, _ = observed.Peek(ctx, "k", 1)
	for i, want := range []struct{ op, outcome string }{
		{"Allow", observe.Admitted},
		{"Allow", observe.Refused},
		{"Allow", observe.Invalid},
		{"Allow", observe.Canceled},
		{"Peek", observe.Refused},
	} {
		if i >= len(calls) {
			t.Fatalf("%d calls seen, want 5", len(calls))
		}
		if c := calls[i]; c.Op != want.op || c.Outcome != want.outcome {
			t.Errorf("call %d: %s %s, want %s %s", i, c.Op, c.Outcome, want.op, want.outcome)
		}
	}
	if !calls[4].Peek() || calls[0].Peek() {
		t.Error("Peek() does not tell a Peek from a decision")
	}
}
