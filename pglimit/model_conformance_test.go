package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// envModelSeed reruns TestModelConformance or TestModelAPI with the seed
// a failed run logged.
const envModelSeed = "PGLIMIT_MODEL_SEED"

// Every strategy decides exactly as the reference model does, decision for
// decision, on random sequences of requests on one key: random limits (1 to
// 3, random algorithms, rates, periods of 20ms to 2s, bursts), random
// operations and costs, random gaps. The model is fed the database time of
// each decision (pglimit.DecisionAt), so every field is compared exactly,
// to the microsecond: nothing is rounded.
//
// Range supports only a cooldown (one GCRA limit with Burst 1), so its
// sequences use such limits, and Reserve must be ErrUnsupported there.
//
// The plpgsql runs decide through the PL/pgSQL functions that Distribute
// installs on a Citus cluster, here on plain tables: the third copy of the
// arithmetic is checked wherever the tests run, Citus or not.
func TestModelConformance(t *testing.T) {
	t.Parallel()
	seed := modelSeed(t)
	for i, run := range []struct {
		strategy            pglimit.Strategy
		functions           bool
		sequences, requests int
	}{
		{pglimit.Upsert, false, 48, 100},
		{pglimit.NoWait, false, 48, 100},
		{pglimit.Range, false, 16, 80},
		// The PL/pgSQL copy of the arithmetic (the functions Distribute
		// installs on Citus, and migration 00004's pglimit_decide), on
		// plain PostgreSQL.
		{pglimit.Upsert, true, 24, 100},
		{pglimit.NoWait, true, 24, 100},
		{pglimit.Range, true, 8, 80},
	} {
		name := string(run.strategy)
		if run.functions {
			name += "/plpgsql"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// Sequences run side by side on two pools: a sequence is one
			// caller at a time on its own key, so decisions never contend,
			// and the sleeps between requests overlap.
			pools := []*pgxpool.Pool{testdb.Pool(t), testdb.Pool(t)}
			schema := testdb.Schema(t)
			if run.functions {
				table := map[pglimit.Strategy]string{pglimit.Upsert: "pglimit_upsert", pglimit.NoWait: "pglimit_nowait", pglimit.Range: "pglimit_range"}[run.strategy]
				if err := pglimit.CreateFunctions(context.Background(), pools[0], schema, table); err != nil {
					t.Fatal(err)
				}
			}
			var stats modelStats
			var wg sync.WaitGroup
			sem := make(chan struct{}, 8)
			for seq := range run.sequences {
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					s := &modelSequence{
						t:         t,
						rng:       rand.New(rand.NewPCG(seed, uint64(i)<<32|uint64(seq))),
						pool:      pools[seq%len(pools)],
						strategy:  run.strategy,
						functions: run.functions,
						schema:    schema,
						name:      fmt.Sprintf("seed %d, %s sequence %d", seed, name, seq),
					}
					s.run(run.requests, &stats)
				})
			}
			wg.Wait()
			t.Logf("%s: %d sequences × %d requests: %s", name, run.sequences, run.requests, stats.String())
			if lost := stats.suffixed(" lost a lock wait"); lost*100 > run.sequences*run.requests {
				t.Errorf("%s: %d refusals for a lock wait past NoWait's patience, over 1%% of %d requests", name, lost, run.sequences*run.requests)
			}
		})
	}
}

// modelSeed is the seed of a model test's random sequences: envModelSeed's
// if set, else the clock's. It is logged, so that a failure can be rerun.
func modelSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(envModelSeed); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", envModelSeed, s, err)
		}
	}
	t.Logf("seed %d (rerun with %s=%d)", seed, envModelSeed, seed)
	return seed
}

// modelStats counts what the sequences did, so that a run shows it
// reached every kind of decision.
type modelStats struct {
	mu     sync.Mutex
	counts map[string]int
}

func (st *modelStats) add(what string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.counts == nil {
		st.counts = make(map[string]int)
	}
	st.counts[what]++
}

// suffixed is how many outcomes ending in suffix were counted.
func (st *modelStats) suffixed(suffix string) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	n := 0
	for k, c := range st.counts {
		if strings.HasSuffix(k, suffix) {
			n += c
		}
	}
	return n
}

func (st *modelStats) String() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	total := 0
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(st.counts)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, st.counts[k]))
		if !strings.HasPrefix(k, "Reset") && !strings.HasSuffix(k, "ErrUnsupported") && !strings.HasSuffix(k, " lost a lock wait") {
			total += st.counts[k]
		}
	}
	return fmt.Sprintf("%d decisions compared (%s)", total, strings.Join(parts, ", "))
}

// modelSequence is one random sequence of requests on one key, checked
// against the model.
type modelSequence struct {
	t        *testing.T
	rng      *rand.Rand
	pool     *pgxpool.Pool
	strategy pglimit.Strategy
	// functions decides through the PL/pgSQL functions of a distributed
	// table, here on plain tables.
	functions bool
	schema    string
	name      string
	history   []string
}

// run makes requests requests, counted in stats; it stops at the first
// mismatch.
func (s *modelSequence) run(requests int, stats *modelStats) {
	ctx := context.Background()
	cfg := pglimit.Config{Strategy: s.strategy, Schema: s.schema, Namespace: "model", AsyncCommit: s.rng.IntN(2) == 0}
	var m *model
	if s.strategy == pglimit.Range || s.rng.IntN(8) == 0 {
		l := pglimit.Limit{Rate: 1 + s.rng.IntN(3), Period: s.randPeriod(), Burst: 1}
		if s.rng.IntN(2) == 0 {
			cfg.Cooldown = l.Period
			m = newModel([]pglimit.Limit{{Name: "cooldown", Rate: 1, Period: l.Period, Burst: 1}})
		} else {
			cfg.Limits = []pglimit.Limit{l}
		}
	} else {
		cfg.Limits = s.randLimits()
	}
	if m == nil {
		m = newModel(cfg.Limits)
	}
	s.logf("config %+v", cfg)
	lim, err := pglimit.New(s.pool, &cfg)
	if err != nil {
		s.fail("New: %v", err)
		return
	}
	if s.functions {
		pglimit.UseFunctions(lim)
	}
	if got := lim.Policy().Limits; !slices.Equal(got, m.limits) {
		s.fail("Policy().Limits = %+v, want %+v", got, m.limits)
		return
	}
	key := fmt.Sprintf("%s-%d", s.name, s.rng.Uint64())
	capacity := math.MaxInt
	allGCRA := true
	for _, l := range m.limits {
		if l.Algorithm == pglimit.GCRA {
			capacity = min(capacity, l.Burst)
		} else {
			capacity = min(capacity, l.Rate)
			allGCRA = false
		}
	}
	for i := range requests {
		time.Sleep(time.Duration(s.rng.IntN(31)) * time.Millisecond)
		var (
			d        pglimit.Decision
			err      error
			n        = randCost(s.rng, capacity)
			mode     = modeAllowN
			maxDelay time.Duration
			commit   = true
			op       string
		)
		r := s.rng.IntN(100)
		if reservable := allGCRA && s.strategy != pglimit.Range; r >= 85 && !reservable && s.rng.IntN(5) != 0 {
			r = s.rng.IntN(85) // check ErrUnsupported now and then, not 15% of the time
		}
		switch {
		case r < 2:
			s.logf("%d: Reset", i)
			if err := lim.Reset(ctx, key); err != nil {
				s.fail("Reset: %v", err)
				return
			}
			m.reset()
			stats.add("Reset")
			continue
		case r < 35:
			op = "AllowN"
			d, err = lim.AllowN(ctx, key, n)
		case r < 55:
			op, mode = "AllowAtMost", modeAtMost
			n = 1 + s.rng.IntN(capacity+3)
			d, err = lim.AllowAtMost(ctx, key, n)
		case r < 70:
			op, commit = "Peek", false
			d, err = lim.Peek(ctx, key, n)
		case r < 85:
			commit = s.rng.IntN(3) != 0
			op = fmt.Sprintf("AllowTxN(commit=%t)", commit)
			d, err = s.allowTx(ctx, lim, key, n, commit)
		default:
			op, mode = "Reserve", modeReserve
			maxDelay = time.Duration(s.rng.IntN(300_001)) * time.Microsecond
			n = randReserveCost(s.rng, m.limits, maxDelay)
			d, err = lim.Reserve(ctx, key, n, maxDelay)
			if !allGCRA || s.strategy == pglimit.Range {
				if !errors.Is(err, pglimit.ErrUnsupported) {
					s.fail("%d: Reserve(%d, %s) on %s with %+v: %+v, %v; want ErrUnsupported", i, n, maxDelay, s.strategy, m.limits, d, err)
					return
				}
				stats.add("Reserve ErrUnsupported")
				continue
			}
		}
		if err != nil {
			s.fail("%d: %s(n=%d, maxDelay=%s): %v", i, op, n, maxDelay, err)
			return
		}
		at := pglimit.DecisionAt(d)
		if at == 0 && s.strategy == pglimit.NoWait && !d.Allowed && d.Granted == 0 &&
			d.RetryAfter == lim.Policy().LongestWait() && d.ResetAfter == d.RetryAfter {
			// NoWait refuses what waits longer than its patience (20 ms) for
			// a lock, and says so with the longest wait: on a loaded machine
			// another sequence's writer can hold a lock of the table itself
			// (extending it) that long. The refusal changed nothing: the
			// model's state stays, and the run counts such refusals.
			stats.add(op + " lost a lock wait")
			continue
		}
		want := m.decide(at, n, mode, maxDelay, commit)
		s.logf("%d: at %d %s(n=%d, maxDelay=%s) = %s", i, at, op, n, maxDelay, want)
		if diff := decisionDiff(d, want, m.limits); diff != "" {
			s.fail("%d: %s(n=%d, maxDelay=%s) at %d µs: %s", i, op, n, maxDelay, at, diff)
			return
		}
		switch {
		case !d.Allowed:
			stats.add(op + " refused")
		case mode == modeAtMost && d.Granted < n:
			stats.add(op + " partial")
		case d.Delay > 0:
			stats.add(op + " delayed")
		default:
			stats.add(op + " admitted")
		}
	}
}

func (s *modelSequence) allowTx(ctx context.Context, lim pglimit.Limiter, key string, n int, commit bool) (pglimit.Decision, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return pglimit.Decision{}, err
	}
	defer func() { _ = tx.Rollback(ctx) }() // after Commit, a no-op
	d, err := lim.AllowTxN(ctx, tx, key, n)
	if err != nil {
		return d, err
	}
	if commit {
		return d, tx.Commit(ctx)
	}
	return d, tx.Rollback(ctx)
}

// randPeriod is 20ms to 2s, log-uniform, in whole microseconds (any µs,
// so that Period/Rate rounds).
func (s *modelSequence) randPeriod() time.Duration {
	us := 20_000 * math.Pow(100, s.rng.Float64())
	return time.Duration(us) * time.Microsecond
}

func (s *modelSequence) randLimits() []pglimit.Limit {
	limits := make([]pglimit.Limit, 1+s.rng.IntN(3))
	for i := range limits {
		l := pglimit.Limit{Algorithm: pglimit.Algorithm(s.rng.IntN(3)), Period: s.randPeriod(), Rate: 1 + s.rng.IntN(10)}
		if l.Algorithm == pglimit.GCRA {
			if s.rng.IntN(6) == 0 {
				l.Rate = 1 + s.rng.IntN(1000)
			}
			l.Burst = s.rng.IntN(l.Rate + 3) // 0: the default, 1
		}
		if s.rng.IntN(3) != 0 {
			l.Name = fmt.Sprintf("l%d", i) // else the default name
		}
		limits[i] = l
	}
	return limits
}

// randCost is a cost the limits admit at once, mostly small.
func randCost(rng *rand.Rand, capacity int) int {
	if rng.IntN(4) == 0 {
		return 1 + rng.IntN(capacity)
	}
	return 1 + rng.IntN(min(capacity, 3))
}

// randReserveCost is a cost that every limit could reserve within
// maxDelay (GCRA: n*T <= Burst*T + maxDelay); window limits take any.
func randReserveCost(rng *rand.Rand, limits []pglimit.Limit, maxDelay time.Duration) int {
	most := 10
	for _, l := range limits {
		if l.Algorithm == pglimit.GCRA {
			t := ceilDiv(l.Period.Microseconds(), int64(l.Rate))
			most = min(most, int((int64(l.Burst)*t+maxDelay.Microseconds())/t))
		}
	}
	return 1 + rng.IntN(most)
}

func (s *modelSequence) logf(format string, args ...any) {
	s.history = append(s.history, fmt.Sprintf(format, args...))
}

func (s *modelSequence) fail(format string, args ...any) {
	s.t.Helper()
	h := s.history[max(len(s.history)-12, 1):]
	s.t.Errorf("%s: %s\nconfig and last steps:\n  %s\n  %s", s.name, fmt.Sprintf(format, args...), s.history[0], strings.Join(h, "\n  "))
}

// decisionDiff describes how d differs from the model's decision.
func decisionDiff(d pglimit.Decision, want modelDecision, limits []pglimit.Limit) string {
	var diffs []string
	check := func(field string, got, want any) {
		if got != want {
			diffs = append(diffs, fmt.Sprintf("%s = %v, want %v", field, got, want))
		}
	}
	us := func(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
	check("Allowed", d.Allowed, want.Allowed)
	check("Granted", d.Granted, want.Granted)
	check("Remaining", d.Remaining, want.Remaining)
	check("RetryAfter", d.RetryAfter, us(want.RetryAfter))
	check("ResetAfter", d.ResetAfter, us(want.ResetAfter))
	check("Delay", d.Delay, us(want.Delay))
	check("Limit", limitString(d.Limit), limitString(limits[want.Binding]))
	var got, wantNames []string
	for _, l := range d.Violated() {
		got = append(got, l.Name)
	}
	for _, i := range want.Violated {
		wantNames = append(wantNames, limits[i].Name)
	}
	check("Violated()", strings.Join(got, ","), strings.Join(wantNames, ","))
	return strings.Join(diffs, "; ")
}

// limitString is l's exported fields: two limiters of one calendar window
// hold its zone in different *time.Location values.
func limitString(l pglimit.Limit) string {
	return fmt.Sprintf("{Name:%s Rate:%d Period:%s Burst:%d Algorithm:%s Calendar:%q TimeZone:%q}", l.Name, l.Rate, l.Period, l.Burst, l.Algorithm, l.Calendar, l.TimeZone)
}
