package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// Scenario names, in run order.
const (
	scSeed       = "seed"
	scContention = "contention"
	scManyKeys   = "many-keys"
	scNaive      = "range-naive"
	scLimits     = "limits"
	scCostKeys   = "cost-many-keys"
	scCostHot    = "cost-hot-key"
	scBusy       = "busy-key"
	scTiers      = "tiers"
)

var scenarioNames = []string{scSeed, scContention, scManyKeys, scNaive, scLimits, scCostKeys, scCostHot, scBusy, scTiers}

// limitScenarios compare their own variants (scenario.Variants),
// in-process only: over HTTP the demo's cooldown is the only policy there
// is.
var limitScenarios = []string{scLimits, scCostKeys, scCostHot, scBusy, scTiers}

// Names of the limit sets a limit variant enforces (variant.Limits): the
// limits and cost-* scenarios define the first two, busy-key and tiers
// their own.
const (
	// setGCRA is one GCRA limit with a burst: the cooldown's statement with
	// a tolerance.
	setGCRA = "gcra"
	// setThree is a GCRA limit, a fixed window and a sliding window in one
	// row: the general statement.
	setThree = "3limits"
	// setTiers is the tiers scenario's plan: a GCRA limit per minute and a
	// fixed window per day.
	setTiers = "tiers"
)

// limitStrategies are the strategies that support every algorithm.
var limitStrategies = []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait}

// limitVariants returns the variants of limitScenarios: each strategy of
// limitStrategies as a cooldown, with one GCRA limit and with three limits.
func limitVariants() []variant {
	var out []variant
	for _, s := range limitStrategies {
		v := strategyVariant(s)
		out = append(out, v)
		out = append(out, withLimits(setGCRA, v)...)
		out = append(out, withLimits(setThree, v)...)
	}
	return out
}

// The limit sets of the busy-key scenario: two that bind and one that does
// not, each a single GCRA limit of thousands per second.
var busySets = []struct {
	name  string
	limit pglimit.Limit
}{
	{"5k", pglimit.Limit{Name: "rate", Rate: 5000, Period: time.Second, Burst: 500}},
	{"20k", pglimit.Limit{Name: "rate", Rate: 20000, Period: time.Second, Burst: 2000}},
	{"200k", pglimit.Limit{Name: "rate", Rate: 200_000, Period: time.Second, Burst: 2000}},
}

// busyVariants returns the variants of the busy-key scenario: the peer,
// Upsert and NoWait with each limit set of busySets.
func busyVariants() []variant {
	var out []variant
	for _, set := range busySets {
		out = append(out, withLimits(set.name, peer, strategyVariant(pglimit.Upsert), strategyVariant(pglimit.NoWait))...)
	}
	return out
}

// tiersVariants returns the variants of the tiers scenario: the peer
// without persistence and with appendfsync always, then each strategy of
// limitStrategies, all with the tiers limits.
func tiersVariants() []variant {
	vs := []variant{peer, peerAlways}
	for _, s := range limitStrategies {
		vs = append(vs, strategyVariant(s))
	}
	return withLimits(setTiers, vs...)
}

// strategyVariant is strategy s with the default Config.
func strategyVariant(s pglimit.Strategy) variant { return variant{Name: string(s), Strategy: s} }

// withLimits returns vs enforcing the limit set named set instead of the
// cooldown, each named <name>-<set>.
func withLimits(set string, vs ...variant) []variant {
	out := make([]variant, len(vs))
	for i, v := range vs {
		v.Name += "-" + set
		v.Limits = set
		out[i] = v
	}
	return out
}

// scenarioVariants returns the variants scenarios compare on their own
// (scenario.Variants), each once.
func scenarioVariants(scenarios []scenario) []variant {
	var out []variant
	for _, sc := range scenarios {
		for _, v := range sc.Variants {
			if !slices.ContainsFunc(out, func(o variant) bool { return o.Name == v.Name }) {
				out = append(out, v)
			}
		}
	}
	return out
}

// scenario is one load shape. Closed-loop scenarios run once per level
// (concurrency); the open-loop seed scenario has the single level 0.
type scenario struct {
	Name      string
	About     string
	Cooldown  time.Duration
	Levels    []int
	Duration  time.Duration // per level
	Instances int           // app instances: pools in-process
	Phases    []phase       // open loop when set, per instance
	Keys      int           // distinct keys; 1 is one hot key
	// RoundRobin sends the requests to the keys in turn, each key once
	// per Keys requests, instead of to one drawn at random.
	RoundRobin bool
	// Audit records every admission in the database (a trigger on the
	// Upsert and NoWait tables; Range tables are their own record). Off
	// where it would cost a write per decision and skew throughput.
	Audit bool
	// Limits are the limit sets of the variants that enforce one
	// (variant.Limits), by name; the others enforce Cooldown.
	Limits map[string][]pglimit.Limit
	// Variants, when set, are what the scenario compares, without floors,
	// whatever -strategies says.
	Variants []variant
	// Rounds runs the variants in turn this many times (A B C, C B A, A B
	// C, ...), so that a change in the machine's load falls on all of them
	// alike.
	Rounds int
}

func (s *scenario) openLoop() bool { return s.Phases != nil }

// durations per scenario, for the full run (scale 1) and for -short.
var (
	fullDurations = map[string]time.Duration{scSeed: 10 * time.Minute, scContention: 20 * time.Second, scManyKeys: time.Minute, scNaive: time.Minute,
		scLimits: 30 * time.Second, scCostKeys: 20 * time.Second, scCostHot: 10 * time.Second, scBusy: 10 * time.Second,
		scTiers: 5 * time.Second}
	shortDurations = map[string]time.Duration{scSeed: 5 * time.Second, scContention: time.Second, scManyKeys: 3 * time.Second, scNaive: 3 * time.Second,
		scLimits: 3 * time.Second, scCostKeys: 1500 * time.Millisecond, scCostHot: time.Second, scBusy: time.Second, scTiers: time.Second}
)

// limitsKeys is how many keys the limits scenario shares its load among.
const limitsKeys = 4

// buildScenarios returns the scenarios o selects, with durations scaled.
func buildScenarios(o *options) []scenario {
	durations := fullDurations
	if o.short {
		durations = shortDurations
	}
	dur := func(name string) time.Duration {
		return max(time.Duration(float64(durations[name])*o.scale), 50*time.Millisecond)
	}
	all := []scenario{
		{
			Name: scSeed,
			About: "The seed load: two app instances, one user, each instance sending " +
				"5 req/s, then a ramp 5 → 50 req/s, then 100 req/s (3 : 3 : 4 of the time; open loop, " +
				"both instances on the same schedule), cooldown 2 s. Pass: admitted ≤ allowed, no errors.",
			Cooldown:  2 * time.Second,
			Levels:    []int{0},
			Instances: 2,
			Keys:      1,
			Audit:     true,
		},
		{
			Name: scContention,
			About: "One hot key, closed-loop workers at each concurrency, cooldown 1 h: after the first " +
				"request every decision is a refusal. Shows where each strategy breaks under contention.",
			Cooldown:  time.Hour,
			Levels:    o.levels,
			Duration:  dur(scContention),
			Instances: 1,
			Keys:      1,
			Audit:     true,
		},
		{
			Name: scManyKeys,
			About: fmt.Sprintf("%d users drawn uniformly at random, closed-loop workers at each concurrency, cooldown 100 ms: "+
				"nearly every request is admitted (a write). Raw throughput; no audit trigger.", o.keys),
			Cooldown:  100 * time.Millisecond,
			Levels:    o.concurrency,
			Duration:  dur(scManyKeys),
			Instances: 1,
			Keys:      o.keys,
		},
		{
			Name: scNaive,
			About: "One hot key whose short cooldown (250 ms) keeps expiring, 16 workers over two instances, " +
				"so admissions race all the time: the case where the naive plain-INSERT Range deadlocks. " +
				"Lost periods count whole cooldowns in which nobody was admitted although requests kept coming.",
			Cooldown:  250 * time.Millisecond,
			Levels:    []int{16},
			Duration:  dur(scNaive),
			Instances: 2,
			Keys:      1,
			Audit:     true,
		},
	}
	all = append(all, limitScenarioList(o, dur)...)
	seed := &all[0]
	total := dur(scSeed)
	seed.Phases = []phase{
		{Duration: total * 3 / 10, From: 5, To: 5},
		{Duration: total * 3 / 10, From: 5, To: 50},
		{Duration: total * 4 / 10, From: 100, To: 100},
	}
	seed.Duration = total

	var out []scenario
	for _, s := range all {
		if !slices.Contains(o.scenarios, s.Name) {
			continue
		}
		if o.targets != nil && slices.Contains(limitScenarios, s.Name) {
			continue // parseOptions refuses them when asked for by name
		}
		if o.targets != nil {
			// Over HTTP every URL is an instance, and the demo's cooldown
			// is the one that counts.
			s.Instances = len(o.targets)
			s.Cooldown = o.cooldown
		}
		if o.audit && !s.Audit {
			s.Audit = true
			s.About += " With -audit, the audit trigger records every admission all the same: one more write each."
		}
		out = append(out, s)
	}
	return out
}

// limitScenarioList returns the scenarios of limitScenarios.
func limitScenarioList(o *options, dur func(string) time.Duration) []scenario {
	rate := pglimit.Limit{Name: "rate", Rate: 20, Period: time.Second, Burst: 5}
	window := pglimit.Limit{Name: "window", Rate: 12, Period: 500 * time.Millisecond, Algorithm: pglimit.FixedWindow}
	sliding := pglimit.Limit{Name: "sliding", Rate: 30, Period: 2 * time.Second, Algorithm: pglimit.SlidingWindow}
	keysRate := pglimit.Limit{Name: "rate", Rate: 10, Period: time.Second, Burst: 5}
	hotRate := pglimit.Limit{Name: "rate", Rate: 1, Period: time.Hour, Burst: 5}
	costAbout := " The cost section below compares each strategy's limit variants with its cooldown, " +
		"the variants taking turns (%d rounds); no audit trigger."
	return []scenario{
		{
			Name: scLimits,
			About: fmt.Sprintf("General limits under a burst then steady overload: %d keys, 16 closed-loop workers over two "+
				"instances, all starting at once. Limit sets: %s = %s; %s = %s. The cooldown (50 ms, the same rate "+
				"with burst 1) runs beside them. Pass: the database's record (an audit trigger) shows no interval with "+
				"more admissions than each limit allows (see How to read this), no errors.",
				limitsKeys, setGCRA, describeLimits([]pglimit.Limit{rate}), setThree, describeLimits([]pglimit.Limit{rate, window, sliding})),
			Cooldown:  50 * time.Millisecond,
			Levels:    []int{16},
			Duration:  dur(scLimits),
			Instances: 2,
			Keys:      limitsKeys,
			Audit:     true,
			Limits:    map[string][]pglimit.Limit{setGCRA: {rate}, setThree: {rate, window, sliding}},
			Variants:  limitVariants(),
			Rounds:    1,
		},
		{
			Name: scCostKeys,
			About: fmt.Sprintf("The cost of a decision where nearly all are admitted: %d users drawn uniformly at random, "+
				"closed-loop workers at each concurrency, cooldown 100 ms; %s = %s; %s = %s."+costAbout,
				o.keys, setGCRA, describeLimits([]pglimit.Limit{keysRate}), setThree,
				describeLimits([]pglimit.Limit{keysRate, perMinuteWindow, perHourSliding}), o.rounds),
			Cooldown:  100 * time.Millisecond,
			Levels:    o.concurrency,
			Duration:  dur(scCostKeys),
			Instances: 1,
			Keys:      o.keys,
			Limits: map[string][]pglimit.Limit{setGCRA: {keysRate},
				setThree: {keysRate, perMinuteWindow, perHourSliding}},
			Variants: limitVariants(),
			Rounds:   o.rounds,
		},
		{
			Name: scCostHot,
			About: fmt.Sprintf("The cost of a decision where nearly all are refused: one hot key, closed-loop workers at "+
				"each concurrency, cooldown 1 h; %s = %s; %s = %s."+costAbout,
				setGCRA, describeLimits([]pglimit.Limit{hotRate}), setThree,
				describeLimits([]pglimit.Limit{hotRate, hotWindow, hotSliding}), o.rounds),
			Cooldown:  time.Hour,
			Levels:    o.concurrency,
			Duration:  dur(scCostHot),
			Instances: 1,
			Keys:      1,
			Limits:    map[string][]pglimit.Limit{setGCRA: {hotRate}, setThree: {hotRate, hotWindow, hotSliding}},
			Variants:  limitVariants(),
			Rounds:    o.rounds,
		},
		{
			Name: scBusy,
			About: "One busy key under a limit of thousands per second, two instances, closed-loop workers at each " +
				"concurrency (-busy-levels): " + busyAbout() + ". Each strategy runs beside redis_rate with the same limit. " +
				"Pass: no interval the clients' timings bracket holds more admissions than the limit allows, and the " +
				"database's record (an audit trigger on the writes, which take leases) shows no write past Burst*T plus " +
				"a lease's reach and units enough for every admission; admitted against allowed is how much of the limit the key got.",
			Levels:    o.busyLevels,
			Duration:  dur(scBusy),
			Instances: 2,
			Keys:      1,
			Audit:     true,
			Limits:    busyLimits(),
			Variants:  busyVariants(),
			Rounds:    1,
		},
		{
			Name: scTiers,
			About: fmt.Sprintf("A plan's two limits on each user: %d users taken in turn (round robin), closed-loop workers at "+
				"each concurrency (-concurrency; 1, 8 and 64 by default), %s = %s, so that every request is admitted (see the notes "+
				"if not). Upsert and NoWait decide both limits in one statement on one row; the peer, without persistence "+
				"and with appendfsync always, makes two calls per request (redis_rate checks one limit per call): the "+
				"minute, then the day if the minute admitted, whose window it enforces as GCRA with a burst of its rate. "+
				"No audit trigger.", o.keys, setTiers, describeLimits(tiersLimits)),
			Levels:     tiersLevels(o),
			Duration:   dur(scTiers),
			Instances:  1,
			Keys:       o.keys,
			RoundRobin: true,
			Limits:     map[string][]pglimit.Limit{setTiers: tiersLimits},
			Variants:   tiersVariants(),
			Rounds:     1,
		},
	}
}

// tiersLimits are the tiers scenario's: a plan of 5 a minute with a burst
// of 3, and 1,000 a day, on every user. Users take requests in turn, so
// that every request is admitted: a user may take Burst (3) at once, and
// the run's requests stay within that while they number at most 3 per
// user, 300,000 for 100,000 users. A run lasts 5 s (-scale 1), so up to
// 60,000 decisions/s; a faster run is refused now and then, which the
// report's notes say, with the remedy (more -keys, a smaller -scale). The
// day's window never binds; it is evaluated on every request all the same.
var tiersLimits = []pglimit.Limit{
	{Name: "minute", Rate: 5, Period: time.Minute, Burst: 3},
	{Name: "day", Rate: 1000, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow},
}

// tiersLevels are the tiers scenario's concurrency levels: -concurrency
// when given, else 1, 8 and 64.
func tiersLevels(o *options) []int {
	if o.concurrencySet {
		return o.concurrency
	}
	return []int{1, 8, 64}
}

// busyLimits is busySets as scenario.Limits.
func busyLimits() map[string][]pglimit.Limit {
	out := map[string][]pglimit.Limit{}
	for _, set := range busySets {
		out[set.name] = []pglimit.Limit{set.limit}
	}
	return out
}

// busyAbout describes busySets for a reader.
func busyAbout() string {
	var parts []string
	for _, set := range busySets {
		parts = append(parts, set.name+" = "+describeLimits([]pglimit.Limit{set.limit}))
	}
	return strings.Join(parts, "; ")
}

// The window limits of the cost scenarios: loose enough that the GCRA
// limit decides, so that the three limits are evaluated on every request.
var (
	perMinuteWindow = pglimit.Limit{Name: "minute", Rate: 100, Period: time.Minute, Algorithm: pglimit.FixedWindow}
	perHourSliding  = pglimit.Limit{Name: "hour", Rate: 1000, Period: time.Hour, Algorithm: pglimit.SlidingWindow}
	hotWindow       = pglimit.Limit{Name: "window", Rate: 10, Period: time.Hour, Algorithm: pglimit.FixedWindow}
	hotSliding      = pglimit.Limit{Name: "sliding", Rate: 20, Period: time.Hour, Algorithm: pglimit.SlidingWindow}
)

// describeLimits writes limits for a reader: "rate: GCRA 20 per 1s, burst 5".
func describeLimits(limits []pglimit.Limit) string {
	var parts []string
	for _, l := range limits {
		p := fmt.Sprintf("%s: %s %d per %s", l.Name, l.Algorithm, l.Rate, short(l.Period))
		if l.Algorithm == pglimit.GCRA {
			p += fmt.Sprintf(", burst %d", max(l.Burst, 1))
		}
		parts = append(parts, p)
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

// keyFunc returns how a run picks keys: the hot key, or one of s.Keys users
// uniformly at random, or in turn (RoundRobin; each call's turn starts at
// the first user). prefix keeps runs over HTTP from seeing each other's
// cooldowns.
func (s *scenario) keyFunc(prefix string) func(*rand.Rand) string {
	if s.Keys <= 1 {
		hot := hotKeyName(prefix)
		return func(*rand.Rand) string { return hot }
	}
	n := s.Keys
	if s.RoundRobin {
		var next atomic.Uint64
		return func(*rand.Rand) string { return userKey(prefix, int((next.Add(1)-1)%uint64(n))) }
	}
	return func(rng *rand.Rand) string { return userKey(prefix, rng.IntN(n)) }
}

// allKeys returns every key keyFunc can pick.
func (s *scenario) allKeys(prefix string) []string {
	if s.Keys <= 1 {
		return []string{hotKeyName(prefix)}
	}
	out := make([]string, s.Keys)
	for i := range out {
		out[i] = userKey(prefix, i)
	}
	return out
}

func hotKeyName(prefix string) string { return prefix + "hot" }

func userKey(prefix string, i int) string { return prefix + "u" + strconv.Itoa(i) }

// window is the timeline's time slice: about a hundred points per run.
func (s *scenario) window() time.Duration {
	return min(max(s.Duration/100, 100*time.Millisecond), 10*time.Second)
}
