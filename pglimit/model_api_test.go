package pglimit_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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

// envModelSequence runs one sequence of TestModelAPI only, the one a
// failure names, with the seed it names in envModelSeed.
const envModelSequence = "PGLIMIT_MODEL_SEQUENCE"

// TestModelAPI drives the whole API of two instances, two pools and two
// limiters of one Config on one table, with random sequences on one key
// each, and checks every answer against the reference model (model_test.go):
// Allow, AllowN, AllowAtMost, Peek, Reserve, AllowTxN that commits or rolls
// back, Refund of any earlier decision (the same instance's or the
// other's, any n, more than is left, math.MaxInt), Reset, SetKeyLimits
// (Config.Overrides), and time steps (real sleeps; periods are 20ms to
// 600ms).
// Limits are random: a cooldown, or one to three of GCRA, fixed, sliding
// and calendar windows, on Upsert and NoWait.
//
// Calls one after another are compared exactly, field by field, at the
// database time each decision reports. Now and then both instances call at
// once, from several goroutines: their decisions are then replayed on the
// model in the order of their database times (a decision that writes reads
// the clock holding the key's row lock, so that is the order the row saw),
// and every admission must be the model's, exactly; a refusal may be
// contention and is not checked. Each sequence ends by comparing Peek from
// both instances with the model: the key's final state.
//
// A failure names the seed and the sequence, prints the configuration and
// the sequence's last steps, and how to rerun it: PGLIMIT_MODEL_SEED=<seed>
// (envModelSeed) repeats the random choices of every sequence,
// PGLIMIT_MODEL_SEQUENCE=<n> runs sequence n only. Decisions depend on
// timing too, so a rerun repeats the operations, not always their outcomes.
// The quick tier (-short) runs 12 sequences of 300 operations, the full
// tier 24 of 600.
func TestModelAPI(t *testing.T) {
	t.Parallel()
	seed := modelSeed(t)
	sequences, ops := 12, 300
	if !testing.Short() {
		sequences, ops = 24, 600
	}
	only := -1
	if s := os.Getenv(envModelSequence); s != "" {
		var err error
		if only, err = strconv.Atoi(s); err != nil || only < 0 || only >= sequences {
			t.Fatalf("%s=%q: want a sequence from 0 to %d", envModelSequence, s, sequences-1)
		}
	}
	pools := [2]*pgxpool.Pool{testdb.Pool(t), testdb.Pool(t)}
	schema := testdb.Schema(t)
	var stats modelStats
	var wg sync.WaitGroup
	sem := make(chan struct{}, 6)
	start, ran := time.Now(), 0
	for seq := range sequences {
		if only >= 0 && seq != only {
			continue
		}
		ran++
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			s := &apiSequence{
				t:     t,
				rng:   rand.New(rand.NewPCG(seed, 1<<40|uint64(seq))),
				pools: pools,
				stats: &stats,
				name:  fmt.Sprintf("seed %d, sequence %d", seed, seq),
				rerun: fmt.Sprintf("%s=%d %s=%d go test -run 'TestModelAPI$' ./pglimit", envModelSeed, seed, envModelSequence, seq),
			}
			s.run(schema, fmt.Sprintf("model-api-%d", seq), ops)
		})
	}
	wg.Wait()
	t.Logf("%d sequences × %d operations in %s: %s", ran, ops, time.Since(start).Round(time.Millisecond), stats.String())
}

// apiSequence is one random sequence of calls on one key from two
// instances, checked against the model.
type apiSequence struct {
	t     *testing.T
	rng   *rand.Rand
	pools [2]*pgxpool.Pool
	stats *modelStats
	name  string
	rerun string

	cfg     pglimit.Config
	lims    [2]pglimit.Limiter
	m       *model
	key     string
	allGCRA bool // Reserve is supported

	decisions []*apiDecision // the latest, for refunds
	history   []string
	failed    bool

	// Decision ids (pglimit.WithID), where the limiter takes them (no
	// Overrides): every id the sequence gave, with the call that first
	// carried it, and the admission each id holds now, if any.
	useIDs  bool
	idCalls map[string]*apiCall
	idList  []string
	ids     map[string]*apiDecision
}

// apiDecision is a decision the sequence may refund, with what the model
// knows of it.
type apiDecision struct {
	id   int
	op   string
	inst int // the limiter that made it
	d    pglimit.Decision
	// rolledBack: an admission whose transaction rolled back, which took
	// nothing.
	rolledBack         bool
	anchors, emissions []int64
	refunded           int
	did                string // its decision id, if any
	idDone             bool   // refunded by its id (RefundID), once
}

func (a *apiDecision) String() string {
	return fmt.Sprintf("#%d (%s on instance %d, granted %d, refunded %d)", a.id, a.op, a.inst, a.d.Granted, a.refunded)
}

// apiCall is one call: what it asks, and then what it got.
type apiCall struct {
	inst     int
	op       string
	n        int
	mode     modelMode
	maxDelay time.Duration
	commit   bool          // AllowTxN: the transaction commits
	hold     time.Duration // AllowTxN: how long the transaction stays open after the decision
	did      string        // its decision id, if any
	d        pglimit.Decision
	err      error
}

func (c *apiCall) String() string {
	s := fmt.Sprintf("%s(n=%d", c.op, c.n)
	if c.op == "Reserve" {
		s += fmt.Sprintf(", maxDelay=%s", c.maxDelay)
	}
	if c.did != "" {
		s += ", id=" + c.did
	}
	return fmt.Sprintf("%s) on instance %d", s, c.inst)
}

func (s *apiSequence) run(schema, namespace string, ops int) {
	ctx := context.Background()
	s.cfg = randAPIConfig(s.rng, schema, namespace)
	s.logf("config %+v", s.cfg)
	for i := range s.lims {
		lim, err := pglimit.New(s.pools[i], &s.cfg)
		if err != nil {
			s.fail("New: %v", err)
			return
		}
		s.lims[i] = lim
	}
	limits := s.lims[0].Policy().Limits
	if got, want := limitStrings(limits), limitStrings(apiPolicy(s.cfg)); got != want {
		s.fail("Policy().Limits = %s, want %s", got, want)
		return
	}
	s.m = newModel(limits)
	s.key = fmt.Sprintf("key-%d", s.rng.Uint64())
	s.allGCRA = !slices.ContainsFunc(limits, func(l pglimit.Limit) bool { return l.Algorithm != pglimit.GCRA })
	s.useIDs = !s.cfg.Overrides
	s.idCalls, s.ids = map[string]*apiCall{}, map[string]*apiDecision{}
	for i := 0; i < ops && !s.failed; i++ {
		s.pause()
		s.step(ctx, i)
	}
	if !s.failed {
		s.final(ctx, ops)
	}
}

// randAPIConfig is a random limiter: Upsert or NoWait, with or without
// per-key limits, a cooldown or one to three limits of every algorithm.
func randAPIConfig(rng *rand.Rand, schema, namespace string) pglimit.Config {
	cfg := pglimit.Config{
		Strategy:    []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait}[rng.IntN(2)],
		Schema:      schema,
		Namespace:   namespace,
		AsyncCommit: rng.IntN(2) == 0,
		Overrides:   rng.IntN(2) == 0,
	}
	if rng.IntN(6) == 0 {
		cfg.Cooldown = apiPeriod(rng)
		return cfg
	}
	cfg.Limits = make([]pglimit.Limit, 1+rng.IntN(3))
	for i := range cfg.Limits {
		l := pglimit.Limit{Name: fmt.Sprintf("l%d", i), Algorithm: pglimit.Algorithm(rng.IntN(3)), Period: apiPeriod(rng), Rate: 1 + rng.IntN(12)}
		switch {
		case l.Algorithm == pglimit.GCRA:
			if rng.IntN(6) == 0 {
				l.Rate = 1 + rng.IntN(1000)
			}
			l.Burst = rng.IntN(min(l.Rate, 12) + 3) // 0: the default, 1
		case l.Algorithm == pglimit.FixedWindow && rng.IntN(2) == 0:
			// Minutes, so that a sequence may see one end; hours and days
			// in zones whose hours start at half past.
			l.Period, l.Calendar = 0, []string{"minute", "minute", "hour", "day"}[rng.IntN(4)]
			l.TimeZone = []string{"", "UTC", "Asia/Kolkata", "America/St_Johns"}[rng.IntN(4)]
		}
		cfg.Limits[i] = l
	}
	// A lone fast GCRA limit leases (docs/limits.md): concurrent calls are
	// then served from units the statement took beforehand, which no
	// decision order explains. Slower limits decide every call.
	if l := cfg.Limits[0]; len(cfg.Limits) == 1 && l.Algorithm == pglimit.GCRA && !cfg.Overrides &&
		ceilDiv(l.Period.Microseconds(), int64(l.Rate)) <= 1000 && l.Burst >= 4 {
		cfg.Limits[0].Rate = 1 + rng.IntN(10)
	}
	return cfg
}

// apiPeriod is 20ms to 600ms, log-uniform, in whole microseconds: keys
// fill up and recover many times in a sequence's few seconds.
func apiPeriod(rng *rand.Rand) time.Duration {
	us := 20_000 * math.Pow(30, rng.Float64())
	return time.Duration(us) * time.Microsecond
}

// apiPolicy is the Policy().Limits that cfg must have: its limits with
// defaults filled in, a calendar window's nominal period and zone.
func apiPolicy(cfg pglimit.Config) []pglimit.Limit {
	if cfg.Cooldown != 0 {
		return []pglimit.Limit{{Name: "cooldown", Rate: 1, Period: cfg.Cooldown, Burst: 1}}
	}
	limits := modelLimits(cfg.Limits)
	for i, l := range limits {
		if l.Calendar != "" {
			limits[i].Period = map[string]time.Duration{"minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour}[l.Calendar]
			limits[i].TimeZone = cmp.Or(l.TimeZone, "UTC")
		}
	}
	return limits
}

func limitStrings(limits []pglimit.Limit) string {
	var s []string
	for _, l := range limits {
		s = append(s, limitString(l))
	}
	return strings.Join(s, ", ")
}

// capacity is the largest cost the key's limits could ever admit at once:
// the least of the limiter's limits (beyond it AllowN is ErrInvalidCost)
// and of the key's own. docs/limits.md does not say what a refusal of a
// cost above the key's own limits tells (its RetryAfter), so the sequences
// do not ask for one.
func (s *apiSequence) capacity() int {
	c := math.MaxInt
	for _, l := range slices.Concat(s.m.limits, s.m.own) {
		if l.Algorithm == pglimit.GCRA {
			c = min(c, l.Burst)
		} else {
			c = min(c, l.Rate)
		}
	}
	return c
}

// pause is a time step: none, a few milliseconds, or up to 150ms.
func (s *apiSequence) pause() {
	switch r := s.rng.IntN(10); {
	case r < 4:
	case r < 9:
		time.Sleep(time.Duration(1+s.rng.IntN(20)) * time.Millisecond)
	default:
		time.Sleep(time.Duration(20+s.rng.IntN(130)) * time.Millisecond)
	}
}

// step makes operation i.
func (s *apiSequence) step(ctx context.Context, i int) {
	inst := s.rng.IntN(2)
	switch r := s.rng.IntN(100); {
	case r < 20:
		s.refund(ctx, i)
	case r < 22:
		s.logf("%d: Reset on instance %d", i, inst)
		if err := s.lims[inst].Reset(ctx, s.key); err != nil {
			s.fail("%d: Reset: %v", i, err)
			return
		}
		s.m.reset()
		s.stats.add("Reset")
	case r < 27 && s.cfg.Overrides:
		s.setKeyLimits(ctx, i, inst)
	case r >= 27 && r < 31:
		s.concurrently(ctx, i)
	default:
		s.decide(ctx, i, s.randCall(inst, r))
	}
}

// decide makes c, a decision, and compares it with the model's.
func (s *apiSequence) decide(ctx context.Context, i int, c *apiCall) {
	s.call(ctx, c)
	if c.op == "Reserve" && !s.allGCRA {
		s.logf("%d: %s = %v", i, c, c.err)
		if !errors.Is(c.err, pglimit.ErrUnsupported) {
			s.fail("%d: %s on %s: %+v, %v; want ErrUnsupported", i, c, limitStrings(s.m.limits), c.d, c.err)
		}
		s.stats.add("Reserve ErrUnsupported")
		return
	}
	if c.err != nil {
		s.fail("%d: %s: %v", i, c, c.err)
		return
	}
	if first := s.ids[c.did]; first != nil {
		s.replayed(i, c, first)
		return
	}
	if c.d.Replayed {
		s.fail("%d: %s: %+v reports Replayed, but no admission holds its id", i, c, c.d)
		return
	}
	s.compare(i, c, "")
	if last := s.decisions[len(s.decisions)-1]; c.did != "" && !s.failed {
		last.did = c.did
		if last.d.Allowed && !last.rolledBack {
			s.ids[c.did] = last
		}
	}
}

// replayed checks c, a call with the id of first, an admission: it is
// first replayed, charged nothing (the model does not move), with what is
// left of a reservation's delay.
func (s *apiSequence) replayed(i int, c *apiCall, first *apiDecision) {
	d, f := c.d, first.d
	s.logf("%d: %s = replay of %s", i, c, first)
	same := d.Allowed && d.Replayed && d.Granted == f.Granted && d.Remaining == f.Remaining &&
		d.ResetAfter == f.ResetAfter && d.Limit.Name == f.Limit.Name && pglimit.DecisionAt(d) == pglimit.DecisionAt(f)
	if first.op == "Reserve" {
		same = same && d.Delay <= f.Delay
	} else {
		same = same && d.Delay == f.Delay
	}
	if !same {
		s.fail("%d: %s = %+v; want %s replayed: %+v", i, c, d, first, f)
		return
	}
	s.stats.add("replay of " + first.op)
}

// withID gives c, a decision's call, a decision id now and then: a new
// one, or one the sequence gave before, with that first call's request
// (a retry), on either instance.
func (s *apiSequence) withID(c *apiCall) {
	if !s.useIDs || c.op == "Peek" || s.rng.IntN(4) != 0 {
		return
	}
	if len(s.idList) > 0 && s.rng.IntN(2) == 0 {
		c.did = s.idList[s.rng.IntN(len(s.idList))]
		first := s.idCalls[c.did]
		c.op, c.n, c.mode, c.maxDelay = first.op, first.n, first.mode, first.maxDelay
		if c.op != "AllowTxN" { // only a transaction rolls back
			c.commit = true
		}
		return
	}
	c.did = fmt.Sprintf("id-%d", len(s.idList))
	s.idList = append(s.idList, c.did)
	s.idCalls[c.did] = c
}

// randCall is a decision's call, by r from 22 to 99: Allow or AllowN,
// AllowAtMost, Peek, AllowTxN or Reserve.
func (s *apiSequence) randCall(inst, r int) *apiCall {
	c := &apiCall{inst: inst, n: randCost(s.rng, s.capacity()), mode: modeAllowN, commit: true}
	switch {
	case r < 55:
		c.op = "AllowN"
		if c.n == 1 && s.rng.IntN(2) == 0 {
			c.op = "Allow"
		}
	case r < 65:
		c.op, c.mode = "AllowAtMost", modeAtMost
		c.n = 1 + s.rng.IntN(s.capacity()+3)
	case r < 75:
		c.op, c.commit = "Peek", false
	case r < 90:
		c.op, c.commit = "AllowTxN", s.rng.IntN(2) == 0
	default:
		if !s.allGCRA && s.rng.IntN(4) != 0 {
			c.op = "AllowN" // ErrUnsupported now and then, not 10% of the time
			return c
		}
		c.op, c.mode = "Reserve", modeReserve
		c.maxDelay = time.Duration(s.rng.IntN(300_001)) * time.Microsecond
		c.n = randReserveCost(s.rng, slices.Concat(s.m.limits, s.m.own), c.maxDelay)
	}
	s.withID(c)
	return c
}

// call makes c on its instance.
func (s *apiSequence) call(ctx context.Context, c *apiCall) {
	lim := s.lims[c.inst]
	if c.did != "" {
		ctx = pglimit.WithID(ctx, c.did)
	}
	switch c.op {
	case "Allow":
		c.d, c.err = lim.Allow(ctx, s.key)
	case "AllowN":
		c.d, c.err = lim.AllowN(ctx, s.key, c.n)
	case "AllowAtMost":
		c.d, c.err = lim.AllowAtMost(ctx, s.key, c.n)
	case "Peek":
		c.d, c.err = lim.Peek(ctx, s.key, c.n)
	case "Reserve":
		c.d, c.err = lim.Reserve(ctx, s.key, c.n, c.maxDelay)
	case "AllowTxN":
		tx, err := s.pools[c.inst].Begin(ctx)
		if err != nil {
			c.err = err
			return
		}
		defer func() { _ = tx.Rollback(ctx) }() // after Commit, a no-op
		if c.d, c.err = lim.AllowTxN(ctx, tx, s.key, c.n); c.err != nil {
			return
		}
		time.Sleep(c.hold)
		if c.commit {
			c.err = tx.Commit(ctx)
		} else {
			c.err = tx.Rollback(ctx)
		}
	default:
		panic(c.op)
	}
}

// compare checks c's decision against the model's at its database time,
// and applies it; phase says where it was made.
func (s *apiSequence) compare(i int, c *apiCall, phase string) {
	at := pglimit.DecisionAt(c.d)
	want := s.m.decide(at, c.n, c.mode, c.maxDelay, c.commit)
	op := c.String()
	if c.op == "AllowTxN" && !c.commit {
		op += ", rolled back"
	}
	id := len(s.decisions)
	s.logf("%d: #%d %s%s at %d = %s", i, id, op, phase, at, want)
	if diff := decisionDiff(c.d, want, s.m.own); diff != "" {
		s.fail("%d: #%d %s%s at %d µs: %s", i, id, op, phase, at, diff)
		return
	}
	s.decisions = append(s.decisions, &apiDecision{
		id: id, op: c.op, inst: c.inst, d: c.d,
		rolledBack: c.d.Allowed && c.op == "AllowTxN" && !c.commit,
		anchors:    want.Anchors, emissions: want.Emissions,
	})
	switch {
	case !c.d.Allowed:
		s.stats.add(c.op + " refused")
	case c.op == "AllowTxN" && !c.commit:
		s.stats.add(c.op + " rolled back")
	case c.mode == modeAtMost && c.d.Granted < c.n:
		s.stats.add(c.op + " partial")
	case c.d.Delay > 0:
		s.stats.add(c.op + " delayed")
	default:
		s.stats.add(c.op + " admitted")
	}
}

// refund gives back units of an earlier decision, and checks the answer
// against docs/limits.md: ErrNotAdmitted for a refusal or a Peek,
// ErrForeignDecision for another limiter's decision, ErrInvalidCost for
// n <= 0 or more units than are left; otherwise each
// limit takes them back by the model's rule, and Refund reports whether
// all did. An admission rolled back took nothing, so nothing comes back:
// false, or ErrInvalidCost.
func (s *apiSequence) refund(ctx context.Context, i int) {
	if len(s.decisions) == 0 {
		return
	}
	recent := s.decisions[max(len(s.decisions)-12, 0):]
	a := recent[s.rng.IntN(len(recent))]
	var pick func(*apiDecision) bool
	switch r := s.rng.IntN(20); {
	case r < 8: // refunded or rolled back before: where the bookkeeping is tested
		pick = func(a *apiDecision) bool { return a.refunded > 0 || a.rolledBack }
	case r < 17: // an admission (or a Peek's)
		pick = func(a *apiDecision) bool { return a.d.Allowed }
	}
	if pick != nil {
		if cands := slices.DeleteFunc(slices.Clone(recent), func(a *apiDecision) bool { return !pick(a) }); len(cands) > 0 {
			a = cands[s.rng.IntN(len(cands))]
		}
	}
	inst := a.inst
	if s.rng.IntN(8) == 0 {
		inst = 1 - inst
	}
	left := a.d.Granted - a.refunded
	var n int
	switch r := s.rng.IntN(100); {
	case r < 65:
		n = 1 + s.rng.IntN(max(left, 1))
	case r < 77:
		n = left + 1 + s.rng.IntN(2)
	case r < 87:
		n = math.MaxInt
	case r < 92:
		n = -s.rng.IntN(2)
	default:
		n = 1
	}
	if a.did != "" && s.rng.IntN(4) != 0 {
		s.refundID(ctx, i, a.did, n)
		return
	}
	ok, err := s.lims[inst].Refund(ctx, a.d, n)
	what := fmt.Sprintf("%d: Refund(%s, n=%d) on instance %d", i, a, n, inst)
	s.logf("%s = %t, %v", what, ok, err)
	defer s.peekAfter(ctx, i, what)
	refused := func(want error, why string) {
		if !errors.Is(err, want) {
			s.fail("%s = %t, %v; want %v: %s", what, ok, err, want, why)
		}
		s.stats.add(fmt.Sprintf("Refund %v", want))
	}
	invalid := func(why string) { refused(pglimit.ErrInvalidCost, why) }
	switch {
	case a.did != "":
		refused(pglimit.ErrNotAdmitted, "an admission with an id has no ticket in its value")
	case !a.d.Allowed:
		refused(pglimit.ErrNotAdmitted, "a refusal took nothing")
	case a.op == "Peek":
		refused(pglimit.ErrNotAdmitted, "a Peek took nothing")
	case inst != a.inst:
		refused(pglimit.ErrForeignDecision, "another limiter's decision")
	case n <= 0:
		invalid("n is not positive")
	case a.rolledBack:
		// The transaction rolled back: nothing was taken, and a refund
		// that gave anything back would leave the key better off.
		if (err != nil || ok) && !errors.Is(err, pglimit.ErrInvalidCost) {
			s.fail("%s = %t, %v; want false or ErrInvalidCost: the admission's transaction rolled back, so it took nothing to give back", what, ok, err)
		}
		s.stats.add("Refund of a rollback")
	case n > left:
		invalid(fmt.Sprintf("%d of the %d units granted are left to give back", left, a.d.Granted))
	default:
		if err != nil {
			s.fail("%s: %v", what, err)
			return
		}
		took := s.m.refund(a.anchors, a.emissions, n)
		a.refunded += n
		want := !slices.Contains(took, false)
		if ok != want {
			s.fail("%s = %t, want %t: the limits took the units back: %v", what, ok, want, took)
		}
		s.stats.add(fmt.Sprintf("Refund %t", ok))
	}
}

// refundID gives back n units of the admission the id did holds, by its
// id, from either instance, and checks the answer against docs/limits.md:
// ErrInvalidCost for n <= 0, ErrNotAdmitted where no admission holds the
// id, ErrAlreadySettled once it was refunded by its id, ErrInvalidCost
// for more units than it took; otherwise as Refund.
func (s *apiSequence) refundID(ctx context.Context, i int, did string, n int) {
	inst := s.rng.IntN(2)
	ok, err := pglimit.RefundID(ctx, s.lims[inst], did, n)
	what := fmt.Sprintf("%d: RefundID(%s, n=%d) on instance %d", i, did, n, inst)
	s.logf("%s = %t, %v", what, ok, err)
	defer s.peekAfter(ctx, i, what)
	target := s.ids[did]
	var want error
	switch {
	case n <= 0:
		want = pglimit.ErrInvalidCost
	case target == nil:
		want = pglimit.ErrNotAdmitted
	case target.idDone:
		want = pglimit.ErrAlreadySettled
	case n > target.d.Granted:
		want = pglimit.ErrInvalidCost
	}
	if want != nil {
		if !errors.Is(err, want) {
			s.fail("%s = %t, %v; want %v", what, ok, err, want)
		}
		s.stats.add(fmt.Sprintf("RefundID %v", want))
		return
	}
	if err != nil {
		s.fail("%s: %v", what, err)
		return
	}
	took := s.m.refund(target.anchors, target.emissions, n)
	target.refunded, target.idDone = n, true
	if w := !slices.Contains(took, false); ok != w {
		s.fail("%s = %t, want %t: the limits took the units back: %v", what, ok, w, took)
	}
	s.stats.add(fmt.Sprintf("RefundID %t", ok))
}

// peekAfter compares a Peek with the model after what, a refund: it
// tells a refund that changed the key as the model did not by its own
// line, before a later decision would.
func (s *apiSequence) peekAfter(ctx context.Context, i int, what string) {
	if s.failed {
		return
	}
	c := &apiCall{inst: s.rng.IntN(2), op: "Peek", n: 1 + s.rng.IntN(s.capacity()), mode: modeAllowN}
	s.call(ctx, c)
	if c.err != nil {
		s.fail("%d: %s after %s: %v", i, c, what, c.err)
		return
	}
	s.compare(i, c, " after the refund")
	if s.failed {
		s.t.Errorf("%s: the refund %s changed the key as the model did not", s.name, what)
	}
}

// setKeyLimits gives the key random rates and bursts of its own, takes
// them away, or tries a limit the limiter does not have
// (ErrInvalidConfig, nothing changes).
func (s *apiSequence) setKeyLimits(ctx context.Context, i, inst int) {
	var own []pglimit.Limit
	switch r := s.rng.IntN(10); {
	case r < 2:
	case r < 3:
		own = []pglimit.Limit{{Name: "nope", Rate: 1}}
	default:
		for _, l := range s.m.limits {
			if s.rng.IntN(2) == 0 && len(own) > 0 {
				continue
			}
			o := pglimit.Limit{Name: l.Name}
			if l.Algorithm != pglimit.GCRA || s.rng.IntN(3) != 0 {
				o.Rate = 1 + s.rng.IntN(2*l.Rate+2)
			}
			if l.Algorithm == pglimit.GCRA && (o.Rate == 0 || s.rng.IntN(2) == 0) {
				o.Burst = 1 + s.rng.IntN(min(cmp.Or(o.Rate, l.Rate), 12)+2)
			}
			own = append(own, o)
		}
	}
	err := pglimit.SetKeyLimits(ctx, s.lims[inst], s.key, own...)
	s.logf("%d: SetKeyLimits(%+v) on instance %d = %v", i, own, inst, err)
	if len(own) == 1 && own[0].Name == "nope" {
		if !errors.Is(err, pglimit.ErrInvalidConfig) {
			s.fail("%d: SetKeyLimits with a limit the limiter does not have: %v, want ErrInvalidConfig", i, err)
		}
		s.stats.add("SetKeyLimits ErrInvalidConfig")
		return
	}
	if err != nil {
		s.fail("%d: SetKeyLimits(%+v): %v", i, own, err)
		return
	}
	s.m.setOwn(own...)
	s.stats.add("SetKeyLimits")
}

// concurrently has two to four callers, alternating between the
// instances, make one to three decisions each at once (Allow, AllowN,
// AllowAtMost, AllowTxN), and replays them on the model in the order of
// their database times.
func (s *apiSequence) concurrently(ctx context.Context, i int) {
	var callers [][]*apiCall
	for c := range 2 + s.rng.IntN(3) {
		var calls []*apiCall
		for range 1 + s.rng.IntN(3) {
			call := &apiCall{inst: c % 2, op: "AllowN", n: randCost(s.rng, s.capacity()), mode: modeAllowN, commit: true}
			switch r := s.rng.IntN(10); {
			case r < 1 && call.n == 1:
				call.op = "Allow"
			case r < 2:
				call.op, call.mode = "AllowAtMost", modeAtMost
				call.n = 1 + s.rng.IntN(s.capacity()+3)
			case r < 5:
				call.op, call.commit = "AllowTxN", s.rng.IntN(3) != 0
				call.hold = time.Duration(s.rng.IntN(3000)) * time.Microsecond
			}
			calls = append(calls, call)
		}
		callers = append(callers, calls)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, calls := range callers {
		wg.Go(func() {
			<-start
			for _, c := range calls {
				s.call(ctx, c)
			}
		})
	}
	close(start)
	wg.Wait()
	all := slices.Concat(callers...)
	for _, c := range all {
		if c.err != nil {
			s.fail("%d: concurrently: %s: %v", i, c, c.err)
			return
		}
	}
	// Decisions at the same microsecond (a batch) are in the order that
	// leaves fewer units each time.
	slices.SortStableFunc(all, func(a, b *apiCall) int {
		return cmp.Or(cmp.Compare(pglimit.DecisionAt(a.d), pglimit.DecisionAt(b.d)), cmp.Compare(b.d.Remaining, a.d.Remaining))
	})
	s.logf("%d: %d calls at once:", i, len(all))
	for _, c := range all {
		if !c.d.Allowed {
			// Contention may refuse what the order would admit.
			s.logf("%d:   %s at %d: refused, unchecked", i, c, pglimit.DecisionAt(c.d))
			s.stats.add("concurrent refusal (unchecked)")
			continue
		}
		if s.compare(i, c, " (at once)"); s.failed {
			return
		}
		s.stats.add("concurrent admission")
	}
}

// final compares Peek on both instances with the model: the key's state
// after the sequence.
func (s *apiSequence) final(ctx context.Context, i int) {
	for inst := range s.lims {
		for _, n := range []int{1, s.capacity()} {
			c := &apiCall{inst: inst, op: "Peek", n: n, mode: modeAllowN}
			s.call(ctx, c)
			if c.err != nil {
				s.fail("%d: final %s: %v", i, c, c.err)
				return
			}
			if s.compare(i, c, " (final)"); s.failed {
				return
			}
		}
	}
}

func (s *apiSequence) logf(format string, args ...any) {
	s.history = append(s.history, fmt.Sprintf(format, args...))
}

// fail reports a mismatch with the configuration, the last steps and how
// to rerun the sequence, and ends the sequence.
func (s *apiSequence) fail(format string, args ...any) {
	s.t.Helper()
	s.failed = true
	h := s.history[max(len(s.history)-30, 1):]
	s.t.Errorf("%s: %s\nrerun: %s\nconfig and last steps:\n  %s\n  %s", s.name, fmt.Sprintf(format, args...), s.rerun, s.history[0], strings.Join(h, "\n  "))
}
