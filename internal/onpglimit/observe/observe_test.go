package observe_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/observe"
	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// calls is a pglimit.Observer that keeps every call it sees end.
type calls struct {
	mu   sync.Mutex
	seen []observe.Call
}

func (c *calls) StartDecision(ctx context.Context, _ pglimit.Observation) context.Context {
	return ctx
}

func (c *calls) EndDecision(ctx context.Context, o pglimit.Observation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen = append(c.seen, observe.Observed(ctx, o))
}

// Every call of an observed limiter is seen once, with its method and the
// outcome word its result means.
func TestOutcomes(t *testing.T) {
	t.Parallel()
	obs := &calls{}
	lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: testdb.Schema(t), Cooldown: time.Hour, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, _ = lim.Allow(ctx, "k")
	_, _ = lim.Allow(ctx, "k")
	_, _ = lim.Allow(ctx, "")
	_, _ = lim.Allow(cancelled, "other")
	_, _ = lim.Peek(ctx, "k", 1)
	_ = lim.Reset(ctx, "k")
	calls := obs.seen
	for i, want := range []struct{ op, outcome string }{
		{"Allow", observe.Admitted},
		{"Allow", observe.Refused},
		{"Allow", observe.Invalid},
		{"Allow", observe.Canceled},
		{"Peek", observe.Refused},
		{"Reset", observe.Refused},
	} {
		if i >= len(calls) {
			t.Fatalf("%d calls seen, want 6", len(calls))
		}
		if c := calls[i]; c.Op != want.op || c.Outcome != want.outcome {
			t.Errorf("call %d: %s %s, want %s %s", i, c.Op, c.Outcome, want.op, want.outcome)
		}
	}
	if calls[4].Decides || calls[5].Decides || !calls[0].Decides {
		t.Error("Decides does not tell a Peek or a Reset from a decision")
	}
}
