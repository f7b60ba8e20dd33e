package pglimitsem_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// fairHold is how long the flooding waiters of the fair-share tests hold
// a slot: short, so that a run of a few seconds holds many of them.
const fairHold = 150 * time.Millisecond

// flood is a flow's waiters, from two instances, each taking a slot,
// holding it for fairHold and waiting again until its context ends; it
// records the flow's slot-time within the measured window and how many
// slots the flow holds now.
type flood struct {
	flow    pglimitsem.Flow
	held    atomic.Int64
	mu      sync.Mutex
	busy    time.Duration // slot-time inside [from, to)
	from    time.Time
	to      time.Time
	lastUp  atomic.Int64 // UnixNano of the flow's last release
	running atomic.Int64 // the flow's goroutines
	// stop, once set, makes each of the flow's goroutines end after the
	// slot it waits for or holds: the flow stops sending work, without a
	// statement cut off (a slot taken by a statement cut off stays held
	// until its lease ends).
	stop atomic.Bool
	// took, if set, is called after each slot the flow takes.
	took func()
}

func (f *flood) run(t *testing.T, ctx context.Context, sem *pglimitsem.Semaphore, key string) {
	f.running.Add(1)
	defer f.running.Add(-1)
	for ctx.Err() == nil {
		slot, err := sem.WaitFlow(ctx, key, f.flow)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("flow %s: WaitFlow: %v", f.flow.Name, err)
			}
			return
		}
		f.held.Add(1)
		f.mu.Lock()
		took := f.took
		f.mu.Unlock()
		if took != nil {
			took()
		}
		start := time.Now()
		time.Sleep(fairHold)
		end := time.Now()
		f.held.Add(-1)
		if err := sem.Release(context.Background(), slot); err != nil {
			t.Errorf("flow %s: Release: %v", f.flow.Name, err)
		}
		f.lastUp.Store(time.Now().UnixNano())
		f.mu.Lock()
		if s, e := maxTime(start, f.from), minTime(end, f.to); e.After(s) {
			f.busy += e.Sub(s)
		}
		f.mu.Unlock()
		if f.stop.Load() {
			return
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Fair share: 8 slots, 4 flows weighted 1, 1, 2 and 4, each flooding from
// two instances (one through PgBouncer) with more waiters than its share.
// Over many hold times each flow's share of the slot-time is within 10% of
// its weight's share; when the weight-4 flow stops, the others take its
// slots within one hold time of its last release.
func TestWaitFlowFairShare(t *testing.T) {
	t.Parallel()
	testdb.Slow(t)
	schema := testdb.Schema(t)
	cfg := pglimitsem.Config{Schema: schema, Slots: 8, TTL: time.Minute, WaitPoll: 20 * time.Millisecond}
	sems := []*pglimitsem.Semaphore{newSemaphore(t, testdb.Pool(t), cfg), newSemaphore(t, testdb.PgBouncerPool(t), cfg)}
	const warm, window = time.Second, 4 * time.Second // the window: about 27 hold times
	begin := time.Now()
	from, to := begin.Add(warm), begin.Add(warm+window)
	var floods []*flood
	for i, w := range []int{1, 1, 2, 4} {
		floods = append(floods, &flood{flow: pglimitsem.Flow{Name: fmt.Sprintf("flow-%d", i), Weight: w}, from: from, to: to})
	}
	var wg sync.WaitGroup
	ctxs := make([]context.CancelFunc, len(floods))
	for i, f := range floods {
		ctx, cancel := context.WithCancel(context.Background())
		ctxs[i] = cancel
		t.Cleanup(cancel)
		// More waiters than the flow's share, so that each stays backlogged.
		for j := range f.flow.Weight + 2 {
			wg.Go(func() { f.run(t, ctx, sems[j%2], "export") })
		}
	}
	time.Sleep(time.Until(to) + fairHold)
	var total time.Duration
	for _, f := range floods {
		f.mu.Lock()
		total += f.busy
		f.mu.Unlock()
	}
	for _, f := range floods {
		f.mu.Lock()
		share, want := float64(f.busy)/float64(total), float64(f.flow.Weight)/8
		f.mu.Unlock()
		t.Logf("flow %s weight %d: %.3f of the slot-time, its weight's share %.3f", f.flow.Name, f.flow.Weight, share, want)
		if math.Abs(share-want) > want/10 {
			t.Errorf("flow %s weight %d: %.3f of the slot-time, want within 10%% of %.3f", f.flow.Name, f.flow.Weight, share, want)
		}
	}
	if util := float64(total) / float64(8*window); util < 0.5 {
		t.Errorf("the slots were held %.2f of the window; the flows waited while slots were free", util)
	}

	// The weight-4 flow stops: once its last slot is released, the others
	// hold all 8 within one hold time.
	// Each slot the others take after it checks whether they hold all 8,
	// so that no moment of it is missed between two looks.
	heavy := floods[3]
	var full atomic.Int64 // UnixNano when the others first held every slot after heavy's last release
	check := func() {
		if heavy.held.Load() == 0 && floods[0].held.Load()+floods[1].held.Load()+floods[2].held.Load() == 8 {
			full.CompareAndSwap(0, time.Now().UnixNano())
		}
	}
	heavy.stop.Store(true)
	waitFor(t, "the weight-4 flow's last release", func() bool { return heavy.running.Load() == 0 })
	last := time.Unix(0, heavy.lastUp.Load())
	for _, f := range floods[:3] {
		f.mu.Lock()
		f.took = check
		f.mu.Unlock()
	}
	check()
	waitFor(t, "the others to hold every slot", func() bool { return full.Load() != 0 })
	took := time.Unix(0, full.Load()).Sub(last)
	t.Logf("the others held every slot %s after the weight-4 flow's last release", took)
	if took > fairHold {
		t.Errorf("the others took the weight-4 flow's slots %s after its last release, want within one hold time (%s)", took, fairHold)
	}
	for _, cancel := range ctxs {
		cancel()
	}
	wg.Wait()
}

// A new flow of weight 1 gets its first slot within one hold time while
// a heavy flow holds every slot and has 100 waiters queued ahead of it.
func TestWaitFlowNewFlowServed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	cfg := pglimitsem.Config{Schema: schema, Namespace: "fair", Slots: 8, TTL: time.Minute, WaitPoll: 20 * time.Millisecond}
	sems := []*pglimitsem.Semaphore{newSemaphore(t, pool, cfg), newSemaphore(t, testdb.PgBouncerPool(t), cfg)}
	const hold = 300 * time.Millisecond
	heavy := pglimitsem.Flow{Name: "heavy", Weight: 1}
	// The heavy flow's 100 queued waiters: places that arrived first and
	// stay live for the test.
	q := fmt.Sprintf(`INSERT INTO %s (namespace, key, arrived, waiter, expires_at, flow, weight)
		SELECT $1, 'export', (extract(epoch FROM clock_timestamp()) * 1000000)::int8 - 1000000 + g, gen_random_uuid(),
		       clock_timestamp() + interval '1 minute', 'heavy', 1
		FROM generate_series(1, 100) AS g`, pgx.Identifier{schema, "pglimit_slot_waiters"}.Sanitize())
	if _, err := pool.Exec(ctx, q, cfg.Namespace); err != nil {
		t.Fatal(err)
	}
	// The heavy flow holds every slot, each holder waiting again (behind
	// its queue) after each hold.
	stop, cancel := context.WithCancel(ctx)
	defer cancel()
	var holding atomic.Int64
	var wg sync.WaitGroup
	for i := range 8 {
		slot, err := sems[i%2].Acquire(ctx, "export")
		if err != nil || !slot.Acquired {
			t.Fatalf("Acquire: %+v, %v", slot, err)
		}
		holding.Add(1)
		wg.Go(func() {
			sem := sems[i%2]
			for stop.Err() == nil {
				time.Sleep(hold)
				_ = sem.Release(ctx, slot)
				var err error
				if slot, err = sem.WaitFlow(stop, "export", heavy); err != nil {
					return
				}
			}
			_ = sem.Release(ctx, slot)
		})
	}
	start := time.Now()
	slot, err := sems[1].WaitFlow(ctx, "export", pglimitsem.Flow{Name: "new", Weight: 1})
	took := time.Since(start)
	if err != nil || !slot.Acquired {
		t.Fatalf("the new flow's WaitFlow: %+v, %v", slot, err)
	}
	t.Logf("the new flow's first slot after %s", took)
	// The first of heavy's slots is released within one hold time; the
	// new flow's waiter takes it at its wake-up (a release in its process)
	// or its next poll, allowed 10 WaitPoll on a loaded machine. Served in
	// arrival order, it would wait behind the 100 places until they lapse.
	if bound := hold + 10*cfg.WaitPoll; took > bound {
		t.Errorf("the new flow waited %s for its first slot, want within one hold time (%s) and 10 polls (%s)", took, hold, bound)
	}
	cancel()
	wg.Wait()
	if err := sems[1].Release(ctx, slot); err != nil {
		t.Fatal(err)
	}
}

// A flow's queue is bounded: past Config.FlowQueue live places a waiter
// is refused with ErrQueueFull and a RetryAfter, and joins nothing; other
// flows still join.
func TestWaitFlowQueueBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 1, FlowQueue: 3, TTL: time.Minute})
	first, err := sem.Acquire(ctx, "k")
	if err != nil || !first.Acquired {
		t.Fatalf("Acquire: %+v, %v", first, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { _, _ = sem.WaitFlow(wctx, "k", pglimitsem.Flow{Name: "a", Weight: 1}) })
		waitFor(t, fmt.Sprintf("waiter %d's place", i), func() bool { return waiters(t, pool, schema, "k") == i+1 })
	}
	slot, err := sem.WaitFlow(ctx, "k", pglimitsem.Flow{Name: "a", Weight: 1})
	if !errors.Is(err, pglimitsem.ErrQueueFull) || slot.Acquired || slot.RetryAfter <= 0 {
		t.Errorf("a fourth waiter of flow a: %+v, %v; want ErrQueueFull with a RetryAfter", slot, err)
	}
	if n := waiters(t, pool, schema, "k"); n != 3 {
		t.Errorf("%d places after the refusal, want 3", n)
	}
	wg.Go(func() { _, _ = sem.WaitFlow(wctx, "k", pglimitsem.Flow{Name: "b", Weight: 1}) })
	waitFor(t, "flow b's place", func() bool { return waiters(t, pool, schema, "k") == 4 })
	cancel()
	wg.Wait()
}

// Bad flows and a bad FlowQueue are typed errors that write nothing.
func TestWaitFlowBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	for _, n := range []int{-1, 100_001} {
		if _, err := pglimitsem.New(pool, &pglimitsem.Config{Schema: schema, Slots: 1, FlowQueue: n}); !errors.Is(err, pglimit.ErrInvalidConfig) {
			t.Errorf("FlowQueue %d: %v, want ErrInvalidConfig", n, err)
		}
	}
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Slots: 1})
	for _, tc := range []struct {
		key  string
		flow pglimitsem.Flow
		want error
	}{
		{"k", pglimitsem.Flow{Name: "a", Weight: 0}, pglimitsem.ErrInvalidFlow},
		{"k", pglimitsem.Flow{Name: "a", Weight: -1}, pglimitsem.ErrInvalidFlow},
		{"k", pglimitsem.Flow{Name: "a", Weight: 10_001}, pglimitsem.ErrInvalidFlow},
		{"k", pglimitsem.Flow{Name: "", Weight: 1}, pglimitsem.ErrInvalidFlow},
		{"k", pglimitsem.Flow{Name: "a\x00", Weight: 1}, pglimitsem.ErrInvalidFlow},
		{"", pglimitsem.Flow{Name: "a", Weight: 1}, pglimit.ErrInvalidKey},
	} {
		if slot, err := sem.WaitFlow(ctx, tc.key, tc.flow); !errors.Is(err, tc.want) || slot.Acquired {
			t.Errorf("WaitFlow(%q, %+v): %+v, %v; want %v", tc.key, tc.flow, slot, err, tc.want)
		}
	}
	if n := heldSlots(t, pool, schema, "k"); n != 0 {
		t.Errorf("%d slots held after bad input, want 0", n)
	}
	if n := waiters(t, pool, schema, "k"); n != 0 {
		t.Errorf("%d places after bad input, want 0", n)
	}
}

// WaitFlow keeps Wait's bounds: it returns by its context's deadline plus
// boundSlack with the context's cause, leaving no place behind; a
// read-only server is ErrReadOnly and writes nothing.
func TestWaitFlowBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	cfg := pglimitsem.Config{Schema: schema, Slots: 1, TTL: time.Minute, Timeout: time.Second}
	sem := newSemaphore(t, pool, cfg)
	held, err := sem.Acquire(ctx, "k")
	if err != nil || !held.Acquired {
		t.Fatalf("Acquire: %+v, %v", held, err)
	}
	flow := pglimitsem.Flow{Name: "a", Weight: 1}
	const deadline = 200 * time.Millisecond
	cctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := time.Now()
	slot, err := sem.WaitFlow(cctx, "k", flow)
	if took := time.Since(start); took > deadline+boundSlack {
		t.Errorf("returned after %s, past its deadline %s + %s", took, deadline, boundSlack)
	}
	if !errors.Is(err, context.DeadlineExceeded) || slot.Acquired {
		t.Errorf("WaitFlow past its deadline: %+v, %v; want DeadlineExceeded", slot, err)
	}
	if n := waiters(t, pool, schema, "k"); n != 0 {
		t.Errorf("%d places left, want 0", n)
	}

	readOnly := newSemaphore(t, poolWith(t, map[string]string{"default_transaction_read_only": "on"}), cfg)
	if slot, err := readOnly.WaitFlow(ctx, "k", flow); !errors.Is(err, pglimit.ErrReadOnly) || slot.Acquired {
		t.Errorf("WaitFlow on a read-only server: %+v, %v; want ErrReadOnly", slot, err)
	}
	if n := waiters(t, pool, schema, "k"); n != 0 {
		t.Errorf("%d places after ErrReadOnly, want 0", n)
	}
}

// A weight set at runtime wins over the one waiters name, for the flow's
// waiters already queued. Of 2 slots, flow a holds one; a's waiter, then
// b's, wait for the other. With none set, b's goes first (a holds a slot,
// b none: tags 2 and 1); with a's weight set to 3, a's does (tag 2/3).
func TestSetFlowWeight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	for _, set := range []bool{true, false} {
		sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Namespace: fmt.Sprintf("set-%v", set), Slots: 2, TTL: time.Minute})
		heldByA, err := sem.WaitFlow(ctx, "k", pglimitsem.Flow{Name: "a", Weight: 1})
		if err != nil || !heldByA.Acquired {
			t.Fatalf("WaitFlow: %+v, %v", heldByA, err)
		}
		first, err := sem.Acquire(ctx, "k")
		if err != nil || !first.Acquired {
			t.Fatalf("Acquire: %+v, %v", first, err)
		}
		var (
			mu    sync.Mutex
			order []string
			wg    sync.WaitGroup
		)
		for i, name := range []string{"a1", "b1"} {
			wg.Go(func() {
				slot, err := sem.WaitFlow(ctx, "k", pglimitsem.Flow{Name: name[:1], Weight: 1})
				if err != nil {
					t.Errorf("%s: %v", name, err)
					return
				}
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
				_ = sem.Release(ctx, slot)
			})
			waitFor(t, name+"'s place", func() bool { return waiters(t, pool, schema, "k") == i+1 })
		}
		if set {
			if err := sem.SetFlowWeight(ctx, "a", 3); err != nil {
				t.Fatal(err)
			}
		}
		if err := sem.Release(ctx, first); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if err := sem.Release(ctx, heldByA); err != nil {
			t.Fatal(err)
		}
		want := []string{"b1", "a1"}
		if set {
			want = []string{"a1", "b1"}
		}
		if fmt.Sprint(order) != fmt.Sprint(want) {
			t.Errorf("weight set: %v: served %v, want %v", set, order, want)
		}
	}

	// Bad input writes nothing; a reset deletes the weight.
	sem := newSemaphore(t, pool, pglimitsem.Config{Schema: schema, Namespace: "set-true", Slots: 1})
	for _, tc := range []struct {
		flow   string
		weight int
	}{{"a", 0}, {"a", 10_001}, {"", 1}} {
		if err := sem.SetFlowWeight(ctx, tc.flow, tc.weight); !errors.Is(err, pglimitsem.ErrInvalidFlow) {
			t.Errorf("SetFlowWeight(%q, %d): %v, want ErrInvalidFlow", tc.flow, tc.weight, err)
		}
	}
	if err := sem.ResetFlowWeight(ctx, ""); !errors.Is(err, pglimitsem.ErrInvalidFlow) {
		t.Errorf("ResetFlowWeight(\"\"): %v, want ErrInvalidFlow", err)
	}
	weights := func() string {
		rows, err := pool.Query(ctx, fmt.Sprintf("SELECT namespace || '/' || flow || '=' || weight FROM %s ORDER BY 1", pgx.Identifier{schema, "pglimit_slot_flows"}.Sanitize()))
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(got)
	}
	if got := weights(); got != "[set-true/a=3]" {
		t.Errorf("weights after bad input: %s, want [set-true/a=3]", got)
	}
	if err := sem.ResetFlowWeight(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got := weights(); got != "[]" {
		t.Errorf("weights after the reset: %s, want none", got)
	}
}
