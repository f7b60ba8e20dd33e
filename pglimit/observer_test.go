package pglimit_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/cooldown/internal/onpglimit/observe"
	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// recorder is an Observer of every event, which checks that each decision
// ends once, with the context its start returned.
type recorder struct {
	t *testing.T

	mu        sync.Mutex
	started   int
	seen      []observe.Call // the decisions, in the order they ended
	ends      []pglimit.Observation
	batches   []pglimit.BatchObservation
	giveBacks []pglimit.GiveBackObservation
}

var (
	_ pglimit.Observer      = (*recorder)(nil)
	_ pglimit.BatchObserver = (*recorder)(nil)
	_ pglimit.LeaseObserver = (*recorder)(nil)
)

type startedKey struct{}

func (r *recorder) StartDecision(ctx context.Context, o pglimit.Observation) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started++
	if o.Err != nil || o.Took != 0 || o.Decision != (pglimit.Decision{}) {
		r.t.Errorf("%s %q started with an end: %+v", o.Op, o.Key, o)
	}
	return context.WithValue(ctx, startedKey{}, o)
}

func (r *recorder) EndDecision(ctx context.Context, o pglimit.Observation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := ctx.Value(startedKey{}).(pglimit.Observation); !ok || s.Op != o.Op || s.Key != o.Key || s.N != o.N {
		r.t.Errorf("%s %q ended without the context of its start (%+v)", o.Op, o.Key, s)
	}
	r.seen = append(r.seen, observe.Observed(ctx, o))
	r.ends = append(r.ends, o)
}

func (r *recorder) ObserveBatch(_ context.Context, b pglimit.BatchObservation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b.Keys = slices.Clone(b.Keys)
	r.batches = append(r.batches, b)
}

func (r *recorder) ObserveGiveBack(_ context.Context, g pglimit.GiveBackObservation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.giveBacks = append(r.giveBacks, g)
}

// calls returns the decisions seen so far, and the observations.
func (r *recorder) calls() ([]observe.Call, []pglimit.Observation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started != len(r.seen) {
		r.t.Errorf("%d decisions started, %d ended", r.started, len(r.seen))
	}
	return slices.Clone(r.seen), slices.Clone(r.ends)
}

// Every decision method is seen once, start and end, with its method,
// key, cost, the limiter's namespace and strategy, what it returned, and
// the outcome that means; a bad key or cost is seen too, though nothing
// reaches the database.
func TestObserverSeesEveryDecision(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	obs := &recorder{t: t}
	db := &countingDB{Pool: pool}
	lim, err := pglimit.New(db, &pglimit.Config{
		Schema: schema, Namespace: "observed", Strategy: pglimit.NoWait,
		Limits:   []pglimit.Limit{{Rate: 3, Period: time.Hour, Burst: 3}},
		Observer: obs,
	})
	if err != nil {
		t.Fatal(err)
	}
	shadow, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "shadow", Cooldown: time.Hour, Shadow: true, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	type want struct {
		op, key string
		n       int
		outcome string
	}
	var (
		wants   []want
		results []pglimit.Decision
		errs    []error
	)
	call := func(w want, d pglimit.Decision, err error) {
		wants, results, errs = append(wants, w), append(results, d), append(errs, err)
	}
	d, err := lim.Allow(ctx, "k")
	call(want{"Allow", "k", 1, observe.Admitted}, d, err)
	d, err = lim.AllowN(ctx, "k", 1)
	call(want{"AllowN", "k", 1, observe.Admitted}, d, err)
	d, err = lim.Peek(ctx, "k", 2)
	call(want{"Peek", "k", 2, observe.Refused}, d, err)
	d, err = lim.AllowAtMost(ctx, "k", 5)
	call(want{"AllowAtMost", "k", 5, observe.Admitted}, d, err)
	d, err = lim.Reserve(ctx, "k", 1, time.Hour)
	call(want{"Reserve", "k", 1, observe.Admitted}, d, err)
	d, err = lim.AllowN(ctx, "k", 1)
	call(want{"AllowN", "k", 1, observe.Refused}, d, err)
	d, err = lim.AllowTx(ctx, tx, "t")
	call(want{"AllowTx", "t", 1, observe.Admitted}, d, err)
	d, err = lim.AllowTxN(ctx, tx, "t", 2)
	call(want{"AllowTxN", "t", 2, observe.Admitted}, d, err)
	before := db.statements.Load()
	d, err = lim.Allow(ctx, "")
	call(want{"Allow", "", 1, observe.Invalid}, d, err)
	d, err = lim.AllowN(ctx, "k", 0)
	call(want{"AllowN", "k", 0, observe.Invalid}, d, err)
	d, err = lim.Peek(ctx, "bad\x00key", 1)
	call(want{"Peek", "bad\x00key", 1, observe.Invalid}, d, err)
	if n := db.statements.Load() - before; n != 0 {
		t.Errorf("bad input ran %d statements", n)
	}
	d, err = lim.Allow(cancelled, "gone")
	call(want{"Allow", "gone", 1, observe.Canceled}, d, err)
	d, err = shadow.Allow(ctx, "s")
	call(want{"Allow", "s", 1, observe.Admitted}, d, err)
	d, err = shadow.Allow(ctx, "s")
	call(want{"Allow", "s", 1, observe.Shadowed}, d, err)

	seen, ends := obs.calls()
	if len(seen) != len(wants) {
		t.Fatalf("%d decisions seen, want %d", len(seen), len(wants))
	}
	for i, w := range wants {
		c, o := seen[i], ends[i]
		if c.Op != w.op || c.Key != w.key || o.N != w.n || c.Outcome != w.outcome {
			t.Errorf("decision %d: %s %q n=%d %s, want %s %q n=%d %s", i, c.Op, c.Key, o.N, c.Outcome, w.op, w.key, w.n, w.outcome)
		}
		ns, strategy := "observed", pglimit.NoWait
		if i >= len(wants)-2 {
			ns, strategy = "shadow", pglimit.Upsert
		}
		if o.Namespace != ns || o.Strategy != strategy {
			t.Errorf("decision %d: limiter %s/%s, want %s/%s", i, o.Namespace, o.Strategy, ns, strategy)
		}
		if o.Err != errs[i] || o.Decision.Allowed != results[i].Allowed || o.Decision.Granted != results[i].Granted || o.Decision.Shadow != results[i].Shadow {
			t.Errorf("decision %d: saw %+v, %v; the caller got %+v, %v", i, o.Decision, o.Err, results[i], errs[i])
		}
		if o.Took < 0 || (c.Outcome == observe.Admitted && o.Took == 0) {
			t.Errorf("decision %d: took %s", i, o.Took)
		}
	}
}

// The operations beside the decision methods are seen too, with their
// key or id, their units and their error: Reset, Refund, RefundID,
// Settle, SettleID, Pause, Inspect, LimitedKeys, SetKeyLimits,
// SetKeyLimitsFor, ListKeyLimits, and each level of AllowAll on its own
// limiter's Observer (a level without one is not seen). Their outcomes
// are not decisions: only errors count.
func TestObserverSeesEveryOp(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	obs := &recorder{t: t}
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "ops", Limits: []pglimit.Limit{{Rate: 10, Period: time.Hour, Burst: 10}}, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	unseen, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Namespace: "unseen", Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	d, err := lim.AllowN(ctx, "k", 2)
	if err != nil || !d.Allowed {
		t.Fatalf("AllowN: %+v, %v", d, err)
	}
	type want struct {
		op, key, id string
		n           int
		err         error
	}
	var wants []want
	_, err = lim.Refund(ctx, d, 1)
	wants = append(wants, want{"Refund", "k", "", 1, err})
	_, err = pglimit.Settle(ctx, lim, d, 1)
	wants = append(wants, want{"Settle", "k", "", 1, err})
	_, err = lim.Refund(ctx, pglimit.Decision{}, 1)
	wants = append(wants, want{"Refund", "", "", 1, err})
	if _, err := lim.Allow(pglimit.WithID(ctx, "job-1"), "j"); err != nil {
		t.Fatal(err)
	}
	_, err = pglimit.SettleID(ctx, lim, "job-1", 3)
	wants = append(wants, want{"SettleID", "", "job-1", 3, err})
	_, err = pglimit.RefundID(ctx, lim, "job-1", 1)
	wants = append(wants, want{"RefundID", "", "job-1", 1, err})
	err = pglimit.Pause(ctx, lim, "k", time.Second)
	wants = append(wants, want{"Pause", "k", "", 0, err})
	_, err = pglimit.Inspect(ctx, lim, "k")
	wants = append(wants, want{"Inspect", "k", "", 0, err})
	_, err = pglimit.LimitedKeys(ctx, lim, 1, "", 10)
	wants = append(wants, want{"LimitedKeys", "", "", 1, err})
	err = pglimit.SetKeyLimits(ctx, lim, "k") // ErrInvalidConfig: the limiter sets no Overrides
	wants = append(wants, want{"SetKeyLimits", "k", "", 0, err})
	err = pglimit.SetKeyLimitsFor(ctx, lim, "k", 0) // ErrInvalidConfig: no ttl
	wants = append(wants, want{"SetKeyLimitsFor", "k", "", 0, err})
	_, err = pglimit.ListKeyLimits(ctx, lim, "", 10)
	wants = append(wants, want{"ListKeyLimits", "", "", 0, err})
	err = lim.Reset(ctx, "k")
	wants = append(wants, want{"Reset", "k", "", 0, err})
	ds, err := pglimit.AllowAll(ctx, 1, pglimit.Charge{Limiter: unseen, Key: "u"}, pglimit.Charge{Limiter: lim, Key: "a"})
	if err != nil || !ds.Allowed {
		t.Fatalf("AllowAll: %+v, %v", ds, err)
	}
	wants = append(wants, want{"AllowAll", "a", "", 1, nil})
	if !errors.Is(wants[2].err, pglimit.ErrNotAdmitted) || !errors.Is(wants[4].err, pglimit.ErrAlreadySettled) {
		t.Fatalf("the refund of a zero Decision and the RefundID after a SettleID: %v, %v", wants[2].err, wants[4].err)
	}
	if wants[6].err != nil || !errors.Is(wants[8].err, pglimit.ErrInvalidConfig) || !errors.Is(wants[9].err, pglimit.ErrInvalidConfig) {
		t.Fatalf("Inspect, and SetKeyLimits and SetKeyLimitsFor without Overrides or a ttl: %v, %v, %v", wants[6].err, wants[8].err, wants[9].err)
	}

	all, allEnds := obs.calls()
	var (
		seen []observe.Call
		ends []pglimit.Observation
	)
	for i, o := range allEnds {
		if o.Op != pglimit.OpAllow && o.Op != pglimit.OpAllowN { // the decisions made to have something to act on
			seen, ends = append(seen, all[i]), append(ends, o)
		}
	}
	if len(seen) != len(wants) {
		t.Fatalf("%d operations seen, want %d: %+v", len(seen), len(wants), ends)
	}
	for i, w := range wants {
		c, o := seen[i], ends[i]
		if string(o.Op) != w.op || o.Key != w.key || o.ID != w.id || o.N != w.n || o.Err != w.err || o.Namespace != "ops" {
			t.Errorf("operation %d: %s key %q id %q n=%d err %v in %s; want %s %q %q n=%d err %v", i, o.Op, o.Key, o.ID, o.N, o.Err, o.Namespace, w.op, w.key, w.id, w.n, w.err)
		}
		if c.Decides != (w.op == "AllowAll") {
			t.Errorf("operation %d (%s): Decides %t", i, o.Op, c.Decides)
		}
	}
	if last := ends[len(ends)-1]; !last.Decision.Allowed || last.Decision.Remaining != ds.Levels[1].Remaining {
		t.Errorf("AllowAll's level seen with %+v, want its own %+v", last.Decision, ds.Levels[1])
	}
}

// Under group commit each call is still seen once, on its own; the batch
// statement is seen once for the keys it decided, each key in one batch.
func TestObserverBatch(t *testing.T) {
	t.Parallel()
	obs := &recorder{t: t}
	db := &heldDB{countingDB: countingDB{Pool: testdb.Pool(t)}}
	lim, _ := newBatchLimiter(t, db, pglimit.Upsert, func(cfg *pglimit.Config) { cfg.Observer = obs })
	keys := keysN("b", 32)
	got := gathered(t, db, lim, keys)

	seen, _ := obs.calls()
	byKey := map[string]int{}
	for _, c := range seen {
		byKey[c.Key]++
		if c.Op != "Allow" || c.Outcome != observe.Admitted || !got[c.Key][0].Allowed {
			t.Errorf("%s %q: %s; the caller got %+v", c.Op, c.Key, c.Outcome, got[c.Key])
		}
	}
	for _, k := range keys {
		if byKey[k] != 1 {
			t.Errorf("key %s seen %d times, want once", k, byKey[k])
		}
	}
	if len(seen) != len(keys) {
		t.Errorf("%d decisions seen for %d calls", len(seen), len(keys))
	}

	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.batches) == 0 {
		t.Fatal("no batch seen")
	}
	inBatch := map[string]int{}
	for _, b := range obs.batches {
		if b.Namespace == "" || b.Strategy != pglimit.Upsert || b.Err != nil || b.Took <= 0 {
			t.Errorf("batch %+v", b)
		}
		for _, k := range b.Keys {
			inBatch[k]++
		}
	}
	if len(inBatch) != len(keys)-pglimit.BatchLevel(lim) {
		t.Errorf("%d keys in batches, want the %d that gathered", len(inBatch), len(keys)-pglimit.BatchLevel(lim))
	}
	for k, n := range inBatch {
		if n != 1 {
			t.Errorf("key %s in %d batches", k, n)
		}
	}
}

// A lease's give-back is seen with the units the key's row took back.
func TestObserverGiveBack(t *testing.T) {
	t.Parallel()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	limit := pglimit.Limit{Rate: 4000, Period: time.Second, Burst: 4000}
	obs := &recorder{t: t}
	filler, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Limits: []pglimit.Limit{limit}})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{Schema: schema, Limits: []pglimit.Limit{limit}, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	// As in TestLeaseGivesBack: a row 90% full leaves units to give back.
	if d, err := filler.AllowN(t.Context(), "k", 3600); err != nil || !d.Allowed {
		t.Fatalf("filling the row: %+v, %v", d, err)
	}
	takeLease(t, lim, "k")
	returned := func() (units int64) {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		for _, g := range obs.giveBacks {
			if g.Returned {
				units += g.Units
			}
		}
		return units
	}
	waitFor(t, "the give-back seen", func() bool { return pglimit.GivenBack(lim) > 0 && returned() == pglimit.GivenBack(lim) })
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for _, g := range obs.giveBacks {
		if g.Key != "k" || g.Units <= 0 || g.Strategy != pglimit.Upsert || g.Err != nil {
			t.Errorf("give-back %+v", g)
		}
	}
}

// A limiter without an Observer allocates nothing more for it: a refusal
// the pre-block answers allocates nothing at all. Not parallel:
// AllocsPerRun counts every goroutine's allocations.
func TestObserverNoneAllocatesNothing(t *testing.T) {
	ctx := t.Context()
	lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{Schema: testdb.Schema(t), Cooldown: time.Hour, PreBlockSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
		t.Fatalf("first: %+v, %v", d, err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if d, err := lim.Allow(ctx, "k"); err != nil || d.Allowed {
			t.Fatalf("pre-blocked: %+v, %v", d, err)
		}
	}); n != 0 {
		t.Errorf("a pre-blocked refusal allocates %v times, want 0", n)
	}
}

// levels is a LevelObserver that keeps every move of the in-flight level.
type levels struct {
	mu    sync.Mutex
	moves []pglimit.LevelObservation
}

func (l *levels) StartDecision(ctx context.Context, _ pglimit.Observation) context.Context {
	return ctx
}
func (l *levels) EndDecision(context.Context, pglimit.Observation) {}
func (l *levels) ObserveLevel(o pglimit.LevelObservation) {
	l.mu.Lock()
	l.moves = append(l.moves, o)
	l.mu.Unlock()
}

// The in-flight level moves once the limiter has measured an epoch, a
// LevelObserver sees each move, and the level stays within the pool's
// connections (testdb's pools have 4), above the 2 it starts at.
func TestObserverLevel(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	obs := &levels{}
	lim, _ := newBatchLimiter(t, pool, pglimit.Upsert, func(cfg *pglimit.Config) { cfg.Observer = obs })
	testdb.Spread(t, lim, 16, 100)
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.moves) < 2 {
		t.Fatalf("the level never moved in 1,600 calls of 16 workers: %+v", obs.moves)
	}
	if first := obs.moves[0]; first.From != 0 || first.To != 2 {
		t.Errorf("the first observation is %d to %d, want the start, 0 to 2", first.From, first.To)
	}
	if second := obs.moves[1]; second.From != 2 {
		t.Errorf("the first move left level %d, want the start, 2", second.From)
	}
	most := int(pool.Config().MaxConns)
	for _, m := range obs.moves {
		if m.Namespace == "" || m.Strategy != pglimit.Upsert || m.From == m.To || m.To < 1 || m.To > most {
			t.Errorf("move %+v: want a change within [1, %d], the pool's connections", m, most)
		}
	}
	if got := pglimit.BatchLevel(lim); got < 1 || got > most {
		t.Errorf("level %d after the load, want within [1, %d]", got, most)
	}
}
