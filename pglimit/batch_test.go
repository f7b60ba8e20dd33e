package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// newBatchLimiter builds a limiter of strategy s over db in a schema of
// its own.
func newBatchLimiter(t *testing.T, db pglimit.DB, s pglimit.Strategy, edit func(*pglimit.Config)) (pglimit.Limiter, string) {
	t.Helper()
	schema := testdb.Schema(t)
	cfg := &pglimit.Config{Strategy: s, Schema: schema, Cooldown: time.Hour}
	if edit != nil {
		edit(cfg)
	}
	lim, err := pglimit.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return lim, schema
}

// gathered sends one request per key at once on lim, over db, while
// db holds the first statements, so that every other request gathers in
// one batch; it returns the decisions by key.
func gathered(t *testing.T, db *heldDB, lim pglimit.Limiter, keys []string) map[string][]pglimit.Decision {
	t.Helper()
	// The first statements wait until every other request has gathered:
	// on a loaded machine, the requests' goroutines could otherwise
	// trickle in one statement at a time.
	release := db.hold(pglimit.BatchLevel(lim))
	t.Cleanup(release)
	var (
		got map[string][]pglimit.Decision
		err error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		got, err = allowAll(t.Context(), lim, keys, 1)
	}()
	waitFor(t, "the requests to gather", func() bool { return pglimit.BatchPending(lim) == len(keys)-pglimit.BatchLevel(lim) })
	release()
	<-done
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// allowAll sends one request per key at once, repeated times over, and
// returns the decisions by key.
func allowAll(ctx context.Context, lim pglimit.Limiter, keys []string, repeat int) (map[string][]pglimit.Decision, error) {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs error
		out  = make(map[string][]pglimit.Decision)
	)
	start := make(chan struct{})
	for range repeat {
		for _, key := range keys {
			wg.Go(func() {
				<-start
				d, err := lim.Allow(ctx, key)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = errors.Join(errs, fmt.Errorf("%s: %w", key, err))
					return
				}
				out[key] = append(out[key], d)
			})
		}
	}
	close(start)
	wg.Wait()
	return out, errs
}

// batchSet is a set of limits the batch tests run with: Config.Cooldown,
// which batch.allow decides, or the same limit beside a daily window,
// which batch.general does. Each admits a key at most once an hour.
type batchSet struct {
	name    string
	general bool
}

var batchSets = []batchSet{{"cooldown", false}, {"general", true}}

// limits returns base, and for the general set a window of 100 a day
// beside it, which binds none of the tests' keys.
func (b batchSet) limits(base ...pglimit.Limit) []pglimit.Limit {
	if b.general {
		base = append(base, pglimit.Limit{Name: "day", Rate: 100, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow})
	}
	return base
}

// edit sets cfg's limits: a cooldown of an hour as one GCRA limit, or
// with the window.
func (b batchSet) edit(cfg *pglimit.Config) {
	if b.general {
		cfg.Cooldown, cfg.Limits = 0, b.limits(pglimit.Limit{Name: "hour", Rate: 1, Period: time.Hour, Burst: 1})
	}
}

// eachBatchSet runs f in a parallel subtest for each strategy that
// batches and each of batchSets.
func eachBatchSet(t *testing.T, f func(t *testing.T, s pglimit.Strategy, set batchSet)) {
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		for _, set := range batchSets {
			t.Run(string(s)+"/"+set.name, func(t *testing.T) {
				t.Parallel()
				f(t, s, set)
			})
		}
	}
}

func keysN(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return keys
}

// Concurrent requests on many keys share statements: 64 new keys are
// admitted, then refused, each by fewer statements than requests, and
// every answer is the one the key's own statement would give.
func TestBatchCoalesces(t *testing.T) {
	t.Parallel()
	eachBatchSet(t, func(t *testing.T, s pglimit.Strategy, set batchSet) {
		db := &heldDB{countingDB: countingDB{Pool: testdb.Pool(t)}}
		lim, _ := newBatchLimiter(t, db, s, set.edit)
		keys := keysN("k", 64)
		for round, admit := range []bool{true, false} {
			before := db.statements.Load()
			got := gathered(t, db, lim, keys)
			for _, key := range keys {
				d := got[key][0]
				switch {
				case d.Allowed != admit:
					t.Fatalf("round %d, %s: %+v, want Allowed=%t", round, key, d, admit)
				case admit && (d.ResetAfter <= 0 || d.ResetAfter > time.Hour):
					t.Fatalf("round %d, %s: ResetAfter %s, want in (0, 1h]", round, key, d.ResetAfter)
				case !admit && (d.RetryAfter <= 0 || d.RetryAfter > time.Hour):
					t.Fatalf("round %d, %s: RetryAfter %s, want in (0, 1h]", round, key, d.RetryAfter)
				}
			}
			if n := db.statements.Load() - before; n >= int64(len(keys)) {
				t.Errorf("round %d: %d statements for %d concurrent requests on distinct keys; want fewer", round, n, len(keys))
			}
		}
		if f := pglimit.BatchFailures(lim); f != 0 {
			t.Errorf("%d batch statements failed", f)
		}
	})
}

// heldDB is a countingDB whose next statements can be held.
type heldDB struct {
	countingDB
	mu   sync.Mutex
	left int           // statements still to hold
	gate chan struct{} // closed to let them go
}

// hold makes the next n statements wait until release is called.
func (h *heldDB) hold(n int) (release func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.left, h.gate = n, make(chan struct{})
	return sync.OnceFunc(func() { close(h.gate) })
}

func (h *heldDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	h.mu.Lock()
	gate := h.gate
	if h.left == 0 {
		gate = nil
	} else {
		h.left--
	}
	h.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return h.countingDB.QueryRow(ctx, sql, args...)
}

// rowVersions returns each row's xmin and xmax: a row lock sets xmax, a
// write makes a new version with another xmin.
func rowVersions(t *testing.T, pool *pgxpool.Pool, schema, table string) map[string]string {
	t.Helper()
	rows, err := pool.Query(t.Context(), fmt.Sprintf(`SELECT key, xmin::text || '/' || xmax::text FROM %s`, pgx.Identifier{schema, table}.Sanitize()))
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string)
	for rows.Next() {
		var key, v string
		if err := rows.Scan(&key, &v); err != nil {
			t.Fatal(err)
		}
		out[key] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// A batch of refusals takes no row lock and writes nothing: every row
// keeps its version (xmin) and gets no locker (xmax).
func TestBatchRefusalWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eachBatchSet(t, func(t *testing.T, s pglimit.Strategy, set batchSet) {
		db := &countingDB{Pool: testdb.Pool(t)}
		lim, schema := newBatchLimiter(t, db, s, set.edit)
		keys := keysN("k", 48)
		if _, err := allowAll(ctx, lim, keys, 1); err != nil {
			t.Fatal(err)
		}
		table := "pglimit_" + string(s)
		before := rowVersions(t, db.Pool, schema, table)
		statements := db.statements.Load()
		got, err := allowAll(ctx, lim, keys, 2)
		if err != nil {
			t.Fatal(err)
		}
		if n := db.statements.Load() - statements; n >= int64(2*len(keys)) {
			t.Fatalf("%d statements for %d requests: the refusals were not batched", n, 2*len(keys))
		}
		for _, key := range keys {
			for _, d := range got[key] {
				if d.Allowed {
					t.Fatalf("%s admitted again within its cooldown", key)
				}
			}
		}
		after := rowVersions(t, db.Pool, schema, table)
		for _, key := range keys {
			if before[key] != after[key] || len(before) != len(after) {
				t.Errorf("%s: row xmin/xmax %s before the refusals, %s after: a refusal locked or wrote it", key, before[key], after[key])
			}
		}
	})
}

// Requests for one key in one batch are decided one after the other: a
// limit of 3 per hour admits exactly 3 of 40 concurrent requests, for each
// of several keys batched together, and each refusal says when to come
// back.
func TestBatchSameKeyNoOverAdmission(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eachBatchSet(t, func(t *testing.T, s pglimit.Strategy, set batchSet) {
		lim, _ := newBatchLimiter(t, testdb.Pool(t), s, func(c *pglimit.Config) {
			c.Cooldown = 0
			c.Limits = set.limits(pglimit.Limit{Rate: 3, Period: time.Hour, Burst: 3})
		})
		keys := keysN("hot", 4)
		got, err := allowAll(ctx, lim, keys, 40)
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range keys {
			admitted := 0
			for _, d := range got[key] {
				if d.Allowed {
					admitted++
				} else if d.RetryAfter <= 0 || d.RetryAfter > time.Hour {
					t.Errorf("%s: refusal with RetryAfter %s, want in (0, 1h]", key, d.RetryAfter)
				}
			}
			// NoWait refuses a request that finds the row locked, so it
			// may admit fewer under contention, never more.
			if admitted > 3 || (s == pglimit.Upsert && admitted != 3) {
				t.Errorf("%s: %d of 40 concurrent requests admitted, want 3", key, admitted)
			}
		}
	})
}

// Several instances (pools) batching requests on overlapping keys, in
// random orders, never deadlock: no batch statement fails, no request
// errs, and each key is admitted exactly once per cooldown.
func TestBatchInstancesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eachBatchSet(t, func(t *testing.T, s pglimit.Strategy, set batchSet) {
		schema := testdb.Schema(t)
		var lims []pglimit.Limiter
		for range 3 {
			cfg := &pglimit.Config{Strategy: s, Schema: schema, Cooldown: time.Hour}
			set.edit(cfg)
			lim, err := pglimit.New(testdb.Pool(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			lims = append(lims, lim)
		}
		keys := keysN("k", 30)
		var (
			mu       sync.Mutex
			wg       sync.WaitGroup
			errs     error
			admitted = make(map[string]int)
		)
		for i := range 48 {
			wg.Go(func() {
				lim := lims[i%len(lims)]
				order := rand.Perm(len(keys))
				for _, j := range order {
					d, err := lim.Allow(ctx, keys[j])
					mu.Lock()
					errs = errors.Join(errs, err)
					if d.Allowed {
						admitted[keys[j]]++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if errs != nil {
			t.Fatal(errs)
		}
		for _, key := range keys {
			if n := admitted[key]; n > 1 || (s == pglimit.Upsert && n != 1) {
				t.Errorf("%s admitted %d times, want once", key, n)
			}
		}
		for i, lim := range lims {
			if f := pglimit.BatchFailures(lim); f != 0 {
				t.Errorf("instance %d: %d batch statements failed", i, f)
			}
		}
	})
}

// heldBatcher is a batching limiter over a gated pool whose statements in
// flight are all held (lone requests whose statements wait at the gate),
// so that the next requests gather in one open batch of size keys that is
// sent only when it is full.
func heldBatcher(t *testing.T, s pglimit.Strategy, size int, edit func(*pglimit.Config)) (pglimit.Limiter, *gatedDB, string, *sync.WaitGroup) {
	t.Helper()
	db := newGatedDB(t)
	lim, schema := newBatchLimiter(t, db, s, edit)
	pglimit.SetBatchSize(lim, size)
	var held sync.WaitGroup
	for i := range pglimit.BatchLevel(lim) {
		key := fmt.Sprintf("held-%d", i)
		held.Go(func() {
			if d, err := lim.Allow(context.Background(), key); err != nil || !d.Allowed {
				t.Errorf("%s: %+v, %v", key, d, err)
			}
		})
		<-db.entered
	}
	return lim, db, schema, &held
}

// An error in one key's decision fails that key alone: a trigger that
// rejects one key makes the batch statement fail, and the batch's other
// keys are then decided one by one and admitted.
func TestBatchErrorFailsOnlyItsKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			const size = 8
			lim, db, schema, held := heldBatcher(t, s, size, nil)
			table := pgx.Identifier{schema, "pglimit_" + string(s)}.Sanitize()
			_, err := db.Pool.Exec(ctx, fmt.Sprintf(`
CREATE FUNCTION %[1]s.poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.key = 'poison' THEN RAISE EXCEPTION 'poisoned key'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER poison BEFORE INSERT OR UPDATE ON %[2]s FOR EACH ROW EXECUTE FUNCTION %[1]s.poison();`,
				pgx.Identifier{schema}.Sanitize(), table))
			if err != nil {
				t.Fatal(err)
			}
			keys := append(keysN("k", size-1), "poison")
			var (
				mu   sync.Mutex
				wg   sync.WaitGroup
				errs = make(map[string]error)
				ok   = make(map[string]bool)
			)
			for _, key := range keys {
				wg.Go(func() {
					d, err := lim.Allow(ctx, key)
					mu.Lock()
					defer mu.Unlock()
					errs[key], ok[key] = err, d.Allowed
				})
			}
			<-db.entered // the full batch, sent
			close(db.open)
			wg.Wait()
			held.Wait()
			for _, key := range keys[:size-1] {
				if errs[key] != nil || !ok[key] {
					t.Errorf("%s: admitted %t, error %v; want admitted", key, ok[key], errs[key])
				}
			}
			if err := errs["poison"]; err == nil || ok["poison"] {
				t.Errorf("poison: admitted %t, error %v; want the trigger's error", ok["poison"], err)
			}
			if f := pglimit.BatchFailures(lim); f != 1 {
				t.Errorf("%d batch statements failed, want the one with the poisoned key", f)
			}
		})
	}
}

// One caller's context ending never ends the batch for the others: a
// caller that gives up before its batch is sent leaves it and consumes
// nothing; one that gives up after is decided anyway, and the rest of the
// batch is admitted.
func TestBatchCallerCancelLeavesOthers(t *testing.T) {
	t.Parallel()
	const size = 4
	lim, db, _, held := heldBatcher(t, pglimit.Upsert, size, nil)
	ctx := context.Background()
	result := func(key string, ctx context.Context) chan error {
		ch := make(chan error, 1)
		go func() {
			d, err := lim.Allow(ctx, key)
			if err == nil && !d.Allowed {
				err = fmt.Errorf("%s refused: %+v", key, d)
			}
			ch <- err
		}()
		return ch
	}
	waitPending := func(n int) {
		deadline := time.Now().Add(30 * time.Second)
		for pglimit.BatchPending(lim) != n {
			if time.Now().After(deadline) {
				t.Fatalf("%d calls pending after 30s, want %d", pglimit.BatchPending(lim), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	early, cancelEarly := context.WithCancel(ctx)
	gaveUp := result("gave-up-early", early)
	waitPending(1)
	cancelEarly()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("caller cancelled before its batch was sent: %v, want context.Canceled", err)
	}
	late, cancelLate := context.WithCancel(ctx)
	var rest []chan error
	rest = append(rest, result("gives-up-late", late))
	waitPending(2)
	rest = append(rest, result("a", ctx))
	waitPending(3)
	rest = append(rest, result("b", ctx)) // the fourth key fills the batch
	<-db.entered
	cancelLate()
	if err := <-rest[0]; !errors.Is(err, context.Canceled) {
		t.Fatalf("caller cancelled after its batch was sent: %v, want context.Canceled", err)
	}
	close(db.open)
	for i, ch := range rest[1:] {
		if err := <-ch; err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
	held.Wait()
	// The early caller's key is untouched; the late one's was decided.
	if d, err := lim.Allow(ctx, "gave-up-early"); err != nil || !d.Allowed {
		t.Errorf("gave-up-early after its caller left the batch: %+v, %v; want admitted", d, err)
	}
	if d, err := lim.Peek(ctx, "gives-up-late", 1); err != nil || d.Allowed {
		t.Errorf("gives-up-late, decided in a batch sent before its caller left: %+v, %v; want in cooldown", d, err)
	}
}

// A pending batch is sent as soon as a statement in flight returns: no
// call waits for a window or for the batch to fill.
func TestBatchSentWhenAStatementReturns(t *testing.T) {
	t.Parallel()
	lim, db, _, held := heldBatcher(t, pglimit.Upsert, 64, nil)
	done := make(chan error, 1)
	go func() {
		_, err := lim.Allow(context.Background(), "lone")
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for pglimit.BatchPending(lim) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the lone call did not gather in 30s")
		}
		time.Sleep(time.Millisecond)
	}
	close(db.open) // the held statements return
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	held.Wait()
}

// AllowTx never waits for a batch: it decides in the caller's transaction
// while every batch of the limiter is held.
func TestBatchAllowTxIsNotBatched(t *testing.T) {
	t.Parallel()
	lim, db, _, held := heldBatcher(t, pglimit.Upsert, 64, nil)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, testdb.Pool(t), func(tx pgx.Tx) error {
		d, err := lim.AllowTx(ctx, tx, "in-tx")
		if err == nil && !d.Allowed {
			err = fmt.Errorf("refused: %+v", d)
		}
		return err
	})
	close(db.open)
	held.Wait()
	if err != nil {
		t.Fatal(err)
	}
}

// Range bypasses the batcher.
func TestBatchBypassed(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	for _, c := range []pglimit.Config{
		{Strategy: pglimit.Range, Cooldown: time.Second},
	} {
		lim, err := pglimit.New(pool, &c)
		if err != nil {
			t.Fatal(err)
		}
		if f := pglimit.BatchFailures(lim); f != -1 {
			t.Errorf("%+v batches; want it to bypass the batcher", c)
		}
	}
}

// Calls on one key merge into one entry of one statement, and its units go
// to the calls in arrival order, each decided as its own statement would
// have been, one after the other, at that clock reading: with a burst of 3
// and 5 calls, the first three are admitted with 2, 1 and 0 remaining, the
// last two refused, and the key's state moved by three units only.
func TestBatchMergesSameKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eachBatchSet(t, func(t *testing.T, s pglimit.Strategy, set batchSet) {
		db := newGatedDB(t)
		lim, _ := newBatchLimiter(t, db, s, func(c *pglimit.Config) {
			c.Cooldown, c.Limits = 0, set.limits(pglimit.Limit{Rate: 3, Period: time.Hour, Burst: 3})
		})
		close(db.open) // the first decision checks the table
		if _, err := lim.Allow(ctx, "warm-up"); err != nil {
			t.Fatal(err)
		}
		for len(db.entered) > 0 {
			<-db.entered
		}
		db.open = make(chan struct{})
		var held sync.WaitGroup
		for i := range pglimit.BatchLevel(lim) {
			held.Go(func() {
				if _, err := lim.Allow(ctx, fmt.Sprintf("held-%d", i)); err != nil {
					t.Error(err)
				}
			})
			<-db.entered
		}
		const calls = 5
		got := make([]pglimit.Decision, calls)
		var wg sync.WaitGroup
		for i := range calls {
			wg.Go(func() {
				d, err := lim.Allow(ctx, "hot")
				if err != nil {
					t.Error(err)
				}
				got[i] = d
			})
			for deadline := time.Now().Add(30 * time.Second); pglimit.BatchPending(lim) != i+1; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("call %d did not gather in 30s", i)
				}
			}
		}
		before := db.statements.Load() // the held statements were counted as they entered
		close(db.open)
		wg.Wait()
		held.Wait()
		if n := db.statements.Load() - before; n != 1 {
			t.Errorf("%d statements for %d calls on one key, want 1", n, calls)
		}
		for i, d := range got {
			wantAllowed, wantRemaining := i < 3, max(2-i, 0)
			if d.Allowed != wantAllowed || d.Remaining != wantRemaining {
				t.Errorf("call %d: Allowed %t, Remaining %d; want %t, %d", i, d.Allowed, d.Remaining, wantAllowed, wantRemaining)
			}
			if !d.Allowed && (d.RetryAfter <= 19*time.Minute || d.RetryAfter > 20*time.Minute) {
				t.Errorf("call %d: RetryAfter %s, want about the emission interval of 20m", i, d.RetryAfter)
			}
		}
		if d, err := lim.Peek(ctx, "hot", 1); err != nil || d.Allowed {
			t.Errorf("after the burst: Peek %+v, %v; want refused", d, err)
		}
	})
}

// Two instances, eight workers each, hammer four keys with a 50 ms
// cooldown for a second, so that batches, merged entries and lone
// statements race on every key. An audit trigger records every write of
// the table: consecutive admissions of a key are never less than the
// cooldown apart on the database clock, and the database admitted no more
// than the callers were told. The general set's cooldown is its GCRA
// limit's, whose TAT leads its state.
func TestBatchAuditCooldown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eachBatchSet(t, func(t *testing.T, s pglimit.Strategy, set batchSet) {
		const cooldown = 50 * time.Millisecond
		schema := testdb.Schema(t)
		record := audit(t, testdb.Pool(t), schema, s)
		var lims []pglimit.Limiter
		for range 2 {
			cfg := &pglimit.Config{Strategy: s, Schema: schema, Cooldown: cooldown}
			if set.general {
				cfg.Cooldown, cfg.Limits = 0, set.limits(pglimit.Limit{Name: "cooldown", Rate: 1, Period: cooldown, Burst: 1})
			}
			lim, err := pglimit.New(testdb.Pool(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			lims = append(lims, lim)
		}
		keys := keysN("k", 4)
		var (
			wg       sync.WaitGroup
			admitted atomic.Int64
		)
		stop := time.Now().Add(time.Second)
		for i := range 16 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					d, err := lims[i%2].Allow(ctx, keys[rand.IntN(len(keys))])
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		last := map[string]int64{}
		var writes int64
		for _, r := range record() {
			writes++
			tat := r.expires
			if set.general {
				tat = r.state[0]
			}
			if prev, ok := last[r.key]; ok && tat-prev < cooldown.Microseconds() {
				t.Errorf("%s admitted twice %dµs apart, less than the cooldown of %s", r.key, tat-prev, cooldown)
			}
			last[r.key] = tat
		}
		if writes != admitted.Load() {
			t.Errorf("the database recorded %d admissions, the callers were told of %d", writes, admitted.Load())
		}
	})
}

// Keys with limits of their own (Config.Overrides) batch too, each decided
// by its own limits: requests gathered in one batch on keys of a limiter
// of one per hour, half of them given a burst of 3 of their own, admit 3
// and 1 of 4 calls each. A key whose own row names a limit the limiter
// lacks, and a cost past a key's burst, fail their calls alone, with the
// errors their own statements give.
func TestBatchOwnLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			var cfg pglimit.Config
			lim, db, schema, held := heldBatcher(t, s, 1000, func(c *pglimit.Config) {
				c.Cooldown, c.Namespace, c.Overrides = 0, "own", true
				c.Limits = []pglimit.Limit{{Name: "hour", Rate: 1, Period: time.Hour, Burst: 1}, {Name: "day", Rate: 100, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow}}
				cfg = *c
			})
			keys := keysN("k", 32)
			for _, key := range keys[:16] {
				if err := pglimit.SetKeyLimits(ctx, testdb.Limiter(t, db.Pool, &cfg), key, pglimit.Limit{Name: "hour", Rate: 3, Burst: 3}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := db.Pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "pglimit_overrides"}.Sanitize()+
				` (namespace, key, limits) VALUES ('own', 'bad', '{"nosuch": {"rate": 1}}')`); err != nil {
				t.Fatal(err)
			}
			type result struct {
				key string
				d   pglimit.Decision
				err error
			}
			results := make(chan result, 4*(len(keys)+2))
			var wg sync.WaitGroup
			send := func(key string, n int) {
				wg.Go(func() {
					d, err := lim.AllowN(ctx, key, n)
					results <- result{key, d, err}
				})
			}
			for range 4 {
				for _, key := range keys {
					send(key, 1)
				}
				send("bad", 1)
				send("big", 2) // past the burst of 1 of a key with no limits of its own
			}
			waitFor(t, "the requests to gather", func() bool { return pglimit.BatchPending(lim) == 4*(len(keys)+2) })
			before := db.statements.Load()
			close(db.open)
			wg.Wait()
			held.Wait()
			close(results)
			admitted := map[string]int{}
			for r := range results {
				switch {
				case r.key == "bad":
					if !errors.Is(r.err, pglimit.ErrInvalidConfig) {
						t.Errorf("bad: %+v, %v; want ErrInvalidConfig", r.d, r.err)
					}
				case r.key == "big":
					if !errors.Is(r.err, pglimit.ErrInvalidCost) {
						t.Errorf("2 units on big: %+v, %v; want ErrInvalidCost", r.d, r.err)
					}
				case r.err != nil:
					t.Errorf("%s: %v", r.key, r.err)
				case r.d.Allowed:
					admitted[r.key]++
				}
			}
			for i, key := range keys {
				if want := 1 + 2*max(1-i/16, 0); admitted[key] != want {
					t.Errorf("%s: %d of 4 calls admitted, want %d", key, admitted[key], want)
				}
			}
			// The batch's, and for bad and big, which it cannot decide,
			// their callers' own.
			if n := db.statements.Load() - before; n >= int64(len(keys)) {
				t.Errorf("%d statements for the requests on %d keys; want fewer than one a key", n, len(keys)+2)
			}
		})
	}
}

// A row that another statement updates after a batch statement took its
// snapshot, and before it locks the row, has moved. The batch statement
// locks and writes only the version it read, so it leaves the key
// unanswered (its callers decide it with the statement that waits) and
// the other write stands; the statement that waits for one key follows the
// row to its latest version and decides it. The statement is held after
// its snapshot by an advisory lock the other connection holds while it
// updates the row, and released by that connection's commit. The same
// holds for the batch statements of several limits.
func TestBatchMovedRowUnanswered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, name := range []string{"batch", "batchwait", "generalbatch", "generalbatchwait"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := testdb.Pool(t)
			general := strings.HasPrefix(name, "general")
			lim, schema := newBatchLimiter(t, pool, pglimit.Upsert, func(c *pglimit.Config) {
				c.Namespace = "ns"
				if general {
					c.Cooldown, c.Limits = 0, batchSets[1].limits(pglimit.Limit{Name: "hour", Rate: 1, Period: time.Hour, Burst: 1})
				}
			})
			table := pgx.Identifier{schema, "pglimit_upsert"}.Sanitize()
			if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (namespace, key, expires_at)
				VALUES ('ns', 'moved', now() - interval '2 hours'), ('ns', 'still', now() - interval '2 hours')`, table)); err != nil {
				t.Fatal(err)
			}
			lock := rand.Int32()
			sql := pglimit.Statements(lim)[name]
			held := strings.Replace(sql, "WHERE ", fmt.Sprintf("WHERE pg_advisory_xact_lock(%d, 0) IS NOT NULL AND ", lock), 1)
			if !strings.HasPrefix(sql, "WITH req AS") || held == sql {
				t.Fatalf("%s no longer begins with req, whose WHERE the test holds:\n%s", name, sql)
			}

			mover, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer mover.Rollback(ctx) //nolint:errcheck // committed below
			var moved time.Time
			if err := mover.QueryRow(ctx, fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d, 0) IS NOT NULL`, lock)).Scan(new(bool)); err != nil {
				t.Fatal(err)
			}
			if err := mover.QueryRow(ctx, fmt.Sprintf(`UPDATE %s SET expires_at = now() - interval '1 hour'
				WHERE namespace = 'ns' AND key = 'moved' RETURNING expires_at`, table)).Scan(&moved); err != nil {
				t.Fatal(err)
			}

			hour := time.Hour.Microseconds()
			var keys []string
			var granted []int64
			done := make(chan error, 1)
			go func() {
				if general {
					done <- pool.QueryRow(ctx, held, "ns", []string{"moved", "still"}, []int64{1, 1}, int32(7), []int64{1, 1}).
						Scan(&keys, &granted, nil, nil, nil, nil, nil)
					return
				}
				done <- pool.QueryRow(ctx, held, "ns", []string{"moved", "still"}, []int64{hour, hour}, int32(7),
					[]int64{0, 0}, []int64{1, 1}, []int64{0, 0}, []int64{0, 0}, hour, hour, int64(0)).
					Scan(&keys, &granted, nil, nil, nil, nil, nil, nil)
			}()
			waitFor(t, "the statement to wait for the advisory lock", func() bool {
				var n int
				err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
					AND classid = $1::integer::oid`, lock).Scan(&n)
				return err == nil && n > 0
			})
			if err := mover.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}

			var after time.Time
			if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT expires_at FROM %s WHERE namespace = 'ns' AND key = 'moved'`, table)).Scan(&after); err != nil {
				t.Fatal(err)
			}
			switch {
			case !strings.HasSuffix(name, "wait") && (!slices.Equal(keys, []string{"still"}) || !after.Equal(moved)):
				t.Errorf("%s answered %v (granted %v), moved row's TAT %v, the other write's %v: "+
					"want only still answered and the other write standing", name, keys, granted, after, moved)
			case strings.HasSuffix(name, "wait") && (!slices.Contains(keys, "moved") || !after.After(moved)):
				t.Errorf("%s answered %v (granted %v), moved row's TAT %v, the other write's %v: "+
					"want moved admitted and written", name, keys, granted, after, moved)
			}
		})
	}
}
