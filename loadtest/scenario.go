package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"
)

// Scenario names, in run order.
const (
	scSeed       = "seed"
	scContention = "contention"
	scManyKeys   = "many-keys"
	scNaive      = "range-naive"
)

var scenarioNames = []string{scSeed, scContention, scManyKeys, scNaive}

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
	// Audit records every admission in the database (a trigger on the
	// Upsert and NoWait tables; Range tables are their own record). Off
	// where it would cost a write per decision and skew throughput.
	Audit bool
}

func (s *scenario) openLoop() bool { return s.Phases != nil }

// durations per scenario, for the full run (scale 1) and for -short.
var (
	fullDurations  = map[string]time.Duration{scSeed: 10 * time.Minute, scContention: 20 * time.Second, scManyKeys: time.Minute, scNaive: time.Minute}
	shortDurations = map[string]time.Duration{scSeed: 5 * time.Second, scContention: time.Second, scManyKeys: 3 * time.Second, scNaive: 3 * time.Second}
)

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
			About: "The original article's load: two app instances, one user, each instance sending " +
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
				"so admissions race all the time: the case where the article's plain-INSERT Range deadlocked. " +
				"Lost periods count whole cooldowns in which nobody was admitted although requests kept coming.",
			Cooldown:  250 * time.Millisecond,
			Levels:    []int{16},
			Duration:  dur(scNaive),
			Instances: 2,
			Keys:      1,
			Audit:     true,
		},
	}
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
		if o.targets != nil {
			// Over HTTP every URL is an instance, and the demo's cooldown
			// is the one that counts.
			s.Instances = len(o.targets)
			s.Cooldown = o.cooldown
		}
		out = append(out, s)
	}
	return out
}

// keyFunc returns how a run picks keys: the hot key, or one of s.Keys users
// uniformly at random. prefix keeps runs over HTTP from seeing each other's
// cooldowns.
func (s *scenario) keyFunc(prefix string) func(*rand.Rand) string {
	if s.Keys <= 1 {
		hot := hotKeyName(prefix)
		return func(*rand.Rand) string { return hot }
	}
	n := s.Keys
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
