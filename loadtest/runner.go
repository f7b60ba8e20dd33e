package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// runner runs scenarios against one target, one run at a time: every
// strategy gets the whole machine.
type runner struct {
	opts     *options
	floors   []variant // measured before opts.variants at every level
	target   target
	db       *database // nil over HTTP without -database-url
	ownPools bool      // the pools under test are ours (in-process)
	stderr   io.Writer
	runID    string
}

// result is one run: one variant, one scenario, one level.
type result struct {
	Scenario    string  `json:"scenario"`
	Variant     string  `json:"strategy"`
	HotKey      bool    `json:"hot_key"`     // one key, requested all run long
	Concurrency int     `json:"concurrency"` // closed-loop workers; 0 for open loop
	Instances   int     `json:"instances"`
	Conns       int     `json:"conns_per_instance"`
	CooldownMS  float64 `json:"cooldown_ms"`      // 0 for a variant with Limits
	Limits      string  `json:"limits,omitempty"` // the limit set (scenario.Limits) it enforced
	Round       int     `json:"round,omitempty"`  // of scenario.Rounds, when more than one
	// The 1-minute load average as the run started and ended; the start
	// past the machine's cores makes the run's figures noise.
	LoadStart  float64          `json:"load_average_start,omitempty"`
	LoadEnd    float64          `json:"load_average_end,omitempty"`
	DurationS  float64          `json:"duration_s"`
	Decisions  int64            `json:"decisions"`
	Admitted   int64            `json:"admitted"`
	Refused    int64            `json:"refused"`
	ErrorCount int64            `json:"error_count"`
	Errors     map[string]int64 `json:"errors"`
	Dropped    int64            `json:"dropped"`
	Rate       float64          `json:"decisions_per_s"`
	FloorRate  float64          `json:"floor_per_s"`
	Ratio      float64          `json:"ratio_to_floor"`
	// The write floor and the peer, at the same level, where they ran.
	WriteFloorRate float64         `json:"write_floor_per_s,omitempty"`
	WriteRatio     float64         `json:"ratio_to_write_floor,omitempty"`
	PeerRate       float64         `json:"redis_rate_per_s,omitempty"`
	PeerRatio      float64         `json:"ratio_to_redis_rate,omitempty"`
	Latency        latency         `json:"latency"`
	Client         *admissionCheck `json:"client_check,omitempty"`
	Record         *admissionCheck `json:"db_record_check,omitempty"`
	DB             *dbStats        `json:"db_delta,omitempty"`
	// RedisCalls are the scripts the peer's run made Redis run, by the
	// server's count: one per limit checked.
	RedisCalls  int64 `json:"redis_calls,omitempty"`
	LockWaitMax int   `json:"lock_waiters_max"` // most backends seen waiting on a lock at once
	// Levels are the in-flight levels the instances' limiters settled on:
	// how many statements each ran at once before calls gathered.
	Levels   []int   `json:"in_flight_levels,omitempty"`
	Timeline []point `json:"timeline,omitempty"`
}

func (r *runner) scenario(ctx context.Context, sc *scenario) ([]*result, error) {
	var out []*result
	variants := append(slices.Clone(r.floors), r.opts.variants...)
	if sc.Variants != nil {
		variants = sc.Variants
	}
	for _, level := range sc.Levels {
		var runs []*result
		for round := range max(sc.Rounds, 1) {
			order := slices.Clone(variants)
			if round%2 == 1 {
				// A B C, then C B A: a drift in the machine's load over the
				// rounds falls on every variant alike.
				slices.Reverse(order)
			}
			for _, v := range order {
				res, err := r.one(ctx, sc, level, v)
				if err != nil {
					return nil, fmt.Errorf("%s at %d: %w", v.Name, level, err)
				}
				if sc.Rounds > 1 {
					res.Round = round + 1
				}
				runs = append(runs, res)
			}
		}
		compare(runs)
		out = append(out, runs...)
	}
	return out, nil
}

// compare sets, on the runs of one level, every ratio to the floors and to
// the peer, but a run's ratio to itself.
func compare(runs []*result) {
	rate := map[string]float64{}
	for _, res := range runs {
		rate[res.Variant] = res.Rate
	}
	ratio := func(res *result, base string, baseRate, ratio *float64) {
		if b := rate[base]; b > 0 && res.Variant != base {
			*baseRate, *ratio = b, res.Rate/b
		}
	}
	for _, res := range runs {
		ratio(res, floorName, &res.FloorRate, &res.Ratio)
		ratio(res, writeFloorName, &res.WriteFloorRate, &res.WriteRatio)
		peer := peerName
		if res.Limits != "" {
			peer += "-" + res.Limits // the peer with the same limit, where a scenario has one
		}
		ratio(res, peer, &res.PeerRate, &res.PeerRatio)
	}
}

// one runs variant v through scenario sc at one level, with fresh
// instances, and gathers every figure.
func (r *runner) one(ctx context.Context, sc *scenario, level int, v variant) (*result, error) {
	conns := r.opts.poolSize
	if !sc.openLoop() {
		conns = (level + sc.Instances - 1) / sc.Instances
	}
	prefix := fmt.Sprintf("lt%s-%s-%d-", r.runID, sc.Name, level)
	limits := sc.Limits[v.Limits]
	if r.db != nil && r.ownPools {
		var seed []string
		if v == writeFloor {
			seed = sc.allKeys(prefix)
		}
		if err := r.db.prepare(ctx, v, sc.Audit, seed); err != nil {
			return nil, err
		}
	}
	// The peer's runs leave PostgreSQL idle: no server figures.
	pg := r.db != nil && !v.Redis
	sess, err := r.target.open(ctx, v, sc.Instances, conns)
	if err != nil {
		return nil, err
	}
	defer sess.close()
	decide, err := sess.deciders(v, sc.Cooldown, limits)
	if err != nil {
		return nil, err
	}
	var (
		before  dbStats
		dbStart time.Time // the run's start on the database clock
		scripts int64     // the peer's, before the run
	)
	counter, peerRun := sess.(scriptCounter)
	peerRun = peerRun && !v.Floor
	if peerRun {
		if scripts, err = counter.scripts(ctx); err != nil {
			return nil, err
		}
	}
	if pg {
		if before, err = r.db.snapshot(ctx); err != nil {
			return nil, err
		}
		if dbStart, err = r.db.now(ctx); err != nil {
			return nil, err
		}
	}

	res := &result{
		Scenario:    sc.Name,
		Variant:     v.Name,
		HotKey:      sc.Keys == 1,
		Concurrency: level,
		Instances:   sc.Instances,
		Conns:       sess.conns(),
		CooldownMS:  ms(sc.Cooldown),
		Limits:      v.Limits,
	}
	if limits != nil {
		res.CooldownMS = 0
	}
	res.LoadStart = load1()
	rec, elapsed := r.drive(ctx, sc, level, v, prefix, pg, decide, res)
	res.LoadEnd = load1()
	if l, ok := sess.(leveled); ok && !v.Floor && !v.Naive && !v.Seed {
		res.Levels = l.levels()
	}
	sess.close() // before settle, which waits for the pools' backends to exit
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if peerRun {
		after, err := counter.scripts(ctx)
		if err != nil {
			return nil, err
		}
		res.RedisCalls = after - scripts
	}
	res.DurationS = elapsed.Seconds()
	res.Decisions = rec.decisions.Load()
	res.Admitted = rec.admitted.Load()
	res.ErrorCount = rec.errored.Load()
	res.Refused = res.Decisions - res.Admitted - res.ErrorCount
	res.Errors = rec.errs
	res.Rate = float64(res.Decisions) / elapsed.Seconds()
	res.Latency = summarise(rec.hist)
	if sc.openLoop() || sc.Name == scNaive {
		res.Timeline = rec.timeline()
	}
	var hot *hotKey
	if res.HotKey && limits == nil {
		// Requests kept coming until the planned end.
		hot = &hotKey{start: 0, end: min(elapsed, sc.Duration)}
	}
	switch {
	case v.Floor:
	case limits != nil:
		c := checkClientLimits(rec.keys, limits)
		res.Client = &c
	default:
		c := checkClient(rec.keys, sc.Cooldown, hot)
		res.Client = &c
	}
	if pg {
		if err := r.databaseFigures(ctx, res, sc, v, limits, before, dbStart, hot, rec); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// scriptCounter is a session on the peer's Redis, which counts the scripts
// it runs.
type scriptCounter interface {
	scripts(ctx context.Context) (int64, error)
}

// drive sends the scenario's load on keys named from prefix and records it,
// with the progress line and, when pg, the lock-waiter sampling around it.
// It sets res.Dropped and res.LockWaitMax.
func (r *runner) drive(ctx context.Context, sc *scenario, level int, v variant, prefix string, pg bool,
	decide []decideFunc, res *result) (*recorder, time.Duration) {
	rec := newRecorder(time.Now(), sc.window(), !v.Floor)
	if r.opts.progress {
		label := sc.Name
		if !sc.openLoop() {
			label += fmt.Sprintf(" c=%d", level)
		}
		defer progress(r.stderr, fmt.Sprintf("%-16s %-11s", label, v.Name), sc.Duration, rec)()
	}
	if pg {
		// A pile-up of backends waiting on a lock shows here before it
		// shows as errors.
		var waiters atomic.Int64
		defer func() { res.LockWaitMax = int(waiters.Load()) }()
		defer every(250*time.Millisecond, func() {
			if n, err := r.db.lockWaiters(ctx); err == nil && int64(n) > waiters.Load() {
				waiters.Store(int64(n))
			}
		})()
	}
	if sc.openLoop() {
		res.Dropped = openLoop(ctx, decide, arrivals(sc.Phases), hotKeyName(prefix), rec)
	} else {
		closedLoop(ctx, decide, level, sc.Duration, sc.keyFunc(prefix), rec)
	}
	return rec, time.Since(rec.start)
}

// databaseFigures adds the server's counters across the run and the check
// of the admissions the database recorded.
func (r *runner) databaseFigures(ctx context.Context, res *result, sc *scenario, v variant, limits []pglimit.Limit,
	before dbStats, dbStart time.Time, hot *hotKey, rec *recorder) error {
	if err := r.db.settle(ctx, r.ownPools); err != nil {
		return err
	}
	after, err := r.db.snapshot(ctx)
	if err != nil {
		return err
	}
	d := after.sub(before)
	res.DB = &d
	if limits != nil {
		if !sc.Audit {
			return nil
		}
		if sc.Name == scBusy {
			// Every limit of the scenario leases: the writes take units.
			writes, err := r.db.recordWrites(ctx, v)
			if err != nil {
				return fmt.Errorf("read the writes the database recorded: %w", err)
			}
			admitted := map[string]int{}
			for k, a := range rec.keys {
				admitted[k] = len(a)
			}
			c := checkRecordLeases(writes, limits[0], admitted)
			res.Record = &c
			return nil
		}
		byKey, err := r.db.recordLimits(ctx, v, limits)
		if err != nil {
			return fmt.Errorf("read the admissions the database recorded: %w", err)
		}
		c := checkRecordLimits(byKey, limits)
		res.Record = &c
		return nil
	}
	byKey, ok, err := r.db.record(ctx, v, sc.Audit)
	if err != nil {
		return fmt.Errorf("read the admissions the database recorded: %w", err)
	}
	if !ok {
		return nil
	}
	// The record holds when each cooldown ends: the admission was a
	// cooldown earlier.
	offsets := make(map[string][]time.Duration, len(byKey))
	for k, ts := range byKey {
		for _, t := range ts {
			offsets[k] = append(offsets[k], t.Sub(dbStart)-sc.Cooldown)
		}
	}
	c := checkRecord(offsets, sc.Cooldown, hot)
	res.Record = &c
	return nil
}

// failures returns why res fails the run: over-admission by a pglimit
// strategy but range-naive, a deadlock in the default Range strategy, errors
// in the seed scenario. Over-admission by range-naive (its failure mode) or
// by the peer is a finding about them, which the report's notes give
// (findings), not a failure of pglimit or of the run.
func failures(res *result, v variant) []string {
	if v.Floor || v == naive || v.Redis {
		return nil
	}
	var out []string
	where := res.where(v)
	broken := brokenBy(v)
	if c := res.Client; c != nil && !c.ok() {
		out = append(out, fmt.Sprintf("%s over-admitted (client check): %d admitted, %d allowed, %d over, %d %s",
			where, c.Admitted, c.MaxAllowed, c.OverAdmitted, c.Violations, broken))
	}
	if c := res.Record; c != nil && !c.ok() {
		out = append(out, fmt.Sprintf("%s over-admitted (database record): %d admitted, %d allowed, %d over, %d %s %v",
			where, c.Admitted, c.MaxAllowed, c.OverAdmitted, c.Violations, broken, c.Malformed))
	}
	if v.Strategy == pglimit.Range && !v.Naive {
		deadlocks := res.Errors["40P01"]
		if res.DB != nil {
			deadlocks = max(deadlocks, res.DB.Deadlocks)
		}
		if deadlocks > 0 {
			out = append(out, fmt.Sprintf("%s deadlocked %d times", where, deadlocks))
		}
	}
	if (res.Scenario == scSeed || res.Scenario == scLimits) && (res.ErrorCount > 0 || res.Dropped > 0) {
		out = append(out, fmt.Sprintf("%s: %d errors %v, %d arrivals dropped", where, res.ErrorCount, res.Errors, res.Dropped))
	}
	return out
}

// where names the variant, scenario and concurrency of res, for messages.
func (res *result) where(v variant) string {
	w := fmt.Sprintf("%s in %s", v.Name, res.Scenario)
	if res.Concurrency > 0 {
		w += fmt.Sprintf(" at concurrency %d", res.Concurrency)
	}
	return w
}

// brokenBy says what over-admission breaks under v's limits.
func brokenBy(v variant) string {
	if v.Limits != "" {
		return "intervals or windows over a limit's bound"
	}
	return "pairs closer than the cooldown"
}

// findings are the notes on res's over-admission by range-naive or the
// peer: reported, not fatal (failures says why).
func findings(res *result, v variant) []string {
	overAdmitted := (res.Client != nil && !res.Client.ok()) || (res.Record != nil && !res.Record.ok())
	switch {
	case !overAdmitted:
		return nil
	case v == naive:
		return []string{fmt.Sprintf("range-naive over-admitted in %s (reported, not fatal): "+
			"a plain INSERT should still be refused by the exclusion constraint, so this needs a look", res.Scenario)}
	case v.Redis && !v.Floor:
		c := res.Client
		return []string{fmt.Sprintf("the peer %s over-admitted (client check; reported, not fatal: a finding about the peer, "+
			"while any over-admission by pglimit fails the run): %d admitted, %d allowed, %d over, %d %s",
			res.where(v), c.Admitted, c.MaxAllowed, c.OverAdmitted, c.Violations, brokenBy(v))}
	}
	return nil
}
