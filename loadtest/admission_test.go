package main

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

const C = time.Second

// at is an admission decided exactly at t (sent and received together).
func at(t time.Duration) admission { return admission{sent: t, received: t} }

func TestCheckClient(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                  string
		byKey                 map[string][]admission
		hot                   *hotKey
		allowed, over, violat int
		lost                  int
	}{
		{name: "nothing", byKey: nil},
		{
			name:    "exactly a cooldown apart",
			byKey:   map[string][]admission{"k": {at(0), at(C), at(2 * C)}},
			allowed: 3,
		},
		{
			name:    "two at once",
			byKey:   map[string][]admission{"k": {at(0), at(0)}},
			allowed: 1, over: 1, violat: 1,
		},
		{
			// The count alone misses it: 3 admissions in a span that allows 4.
			name:    "too close inside a long span",
			byKey:   map[string][]admission{"k": {at(0), at(C / 2), at(3 * C)}},
			allowed: 4, violat: 1,
		},
		{
			// Slow answers: the decisions may have been a cooldown apart.
			name:    "overlapping but not provably close",
			byKey:   map[string][]admission{"k": {{sent: 0, received: 2 * C}, {sent: C / 10, received: C / 5}}},
			allowed: 3,
		},
		{
			name:    "keys are independent",
			byKey:   map[string][]admission{"a": {at(0)}, "b": {at(0)}, "c": {at(C / 3), at(C + C/3)}},
			allowed: 4,
		},
		{
			name:    "a burst of five",
			byKey:   map[string][]admission{"k": {at(0), at(1), at(2), at(3), at(4)}},
			allowed: 1, over: 4, violat: 10,
		},
		{
			name:    "hot key admitted every cooldown",
			byKey:   map[string][]admission{"k": {at(0), at(C), at(2 * C), at(3 * C)}},
			hot:     &hotKey{start: 0, end: 3*C + C/2},
			allowed: 4,
		},
		{
			// 4 lost between the two, 5 after the second.
			name:    "hot key with a stall and a silent end",
			byKey:   map[string][]admission{"k": {at(0), at(5 * C)}},
			hot:     &hotKey{start: 0, end: 10 * C},
			allowed: 6, lost: 9,
		},
		{
			name:    "hot key admitted late",
			byKey:   map[string][]admission{"k": {at(2*C + C/2)}},
			hot:     &hotKey{start: 0, end: 3 * C},
			allowed: 1, lost: 2,
		},
		{
			name: "hot key never admitted",
			hot:  &hotKey{start: 0, end: 3 * C},
			lost: 4,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := checkClient(tt.byKey, C, tt.hot)
			if c.MaxAllowed != tt.allowed || c.OverAdmitted != tt.over || c.Violations != tt.violat || c.LostPeriods != tt.lost {
				t.Fatalf("got %+v; want allowed %d, over %d, violations %d, lost %d", c, tt.allowed, tt.over, tt.violat, tt.lost)
			}
			if c.ok() != (tt.over == 0 && tt.violat == 0) {
				t.Fatalf("ok() = %t for %+v", c.ok(), c)
			}
		})
	}
}

func TestCheckRecord(t *testing.T) {
	t.Parallel()
	good := checkRecord(map[string][]time.Duration{"k": {2 * C, 0, C}, "j": {0}}, C, nil)
	if !good.ok() || good.Admitted != 4 || good.MaxAllowed != 4 || good.MinGapMS != 1000 {
		t.Fatalf("a cooldown apart: %+v", good)
	}
	bad := checkRecord(map[string][]time.Duration{"k": {0, C - time.Microsecond, 5 * C}}, C, &hotKey{start: 0, end: 6 * C})
	if bad.ok() || bad.Violations != 1 || bad.LostPeriods != 4 || bad.MaxGapMS < 4000 {
		t.Fatalf("a microsecond short: %+v; want 1 violation, 3+1 lost periods", bad)
	}
}

func TestAllowedAdmissions(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		span time.Duration
		want int
	}{{0, 1}, {C - 1, 1}, {C, 2}, {10*C + C/2, 11}, {-C, 1}} {
		if got := allowedAdmissions(tt.span, C); got != tt.want {
			t.Errorf("allowedAdmissions(%s, %s) = %d, want %d", tt.span, C, got, tt.want)
		}
	}
}

// TestRecorderCatchesOverAdmission runs the real closed-loop driver against
// a limiter that admits everything, as a broken strategy would, and
// against one that keeps the cooldown: only the first is flagged.
func TestRecorderCatchesOverAdmission(t *testing.T) {
	t.Parallel()
	const cooldown = 50 * time.Millisecond
	hot := func(*rand.Rand) string { return "hot" }
	run := func(d decideFunc) admissionCheck {
		rec := newRecorder(time.Now(), 10*time.Millisecond, true)
		closedLoop(context.Background(), []decideFunc{d, d}, 4, 120*time.Millisecond, hot, rec)
		return checkClient(rec.keys, cooldown, nil)
	}

	broken := run(func(context.Context, string) outcome {
		time.Sleep(time.Millisecond)
		return outcome{allowed: true}
	})
	if broken.ok() || broken.OverAdmitted == 0 || broken.Violations == 0 {
		t.Fatalf("a limiter that admits everything passed: %+v", broken)
	}

	var (
		mu   sync.Mutex
		last time.Time
	)
	correct := run(func(context.Context, string) outcome {
		mu.Lock()
		defer mu.Unlock()
		time.Sleep(time.Millisecond)
		if now := time.Now(); last.IsZero() || now.Sub(last) >= cooldown {
			last = now
			return outcome{allowed: true}
		}
		return outcome{}
	})
	if !correct.ok() || correct.Admitted < 2 {
		t.Fatalf("a limiter that keeps the cooldown: %+v; want ok with at least 2 admissions", correct)
	}
}

func TestArrivals(t *testing.T) {
	t.Parallel()
	// The seed scenario's profile per instance: 900 + 4,950 + 24,000 requests.
	a := arrivals([]phase{
		{Duration: 3 * time.Minute, From: 5, To: 5},
		{Duration: 3 * time.Minute, From: 5, To: 50},
		{Duration: 4 * time.Minute, From: 100, To: 100},
	})
	if len(a) != 29850 {
		t.Fatalf("%d arrivals, want 29850", len(a))
	}
	for i := 1; i < len(a); i++ {
		if a[i] <= a[i-1] {
			t.Fatalf("arrival %d at %s is not after %s", i, a[i], a[i-1])
		}
	}
	if a[0] != 0 || a[1] != 200*time.Millisecond || a[len(a)-1] >= 10*time.Minute {
		t.Fatalf("first arrivals %s, %s, last %s", a[0], a[1], a[len(a)-1])
	}
}

func TestFailures(t *testing.T) {
	t.Parallel()
	over := &admissionCheck{Admitted: 2, MaxAllowed: 1, OverAdmitted: 1}
	rng := variant{Name: "range", Strategy: "range"}
	tests := []struct {
		name string
		res  result
		v    variant
		want int
	}{
		{"clean", result{Scenario: scContention, Client: &admissionCheck{}}, rng, 0},
		{"over-admits", result{Scenario: scContention, Client: over}, rng, 1},
		{"over-admits by the record", result{Scenario: scContention, Client: &admissionCheck{}, Record: over}, rng, 1},
		{"naive over-admits: reported, not fatal", result{Scenario: scContention, Client: over}, naive, 0},
		{"range deadlocks", result{Scenario: scNaive, Errors: map[string]int64{"40P01": 1}}, rng, 1},
		{"range deadlock seen by the server", result{Scenario: scNaive, DB: &dbStats{Deadlocks: 2}}, rng, 1},
		{"naive deadlocks", result{Scenario: scNaive, Errors: map[string]int64{"40P01": 3}}, naive, 0},
		{"seed errors", result{Scenario: scSeed, ErrorCount: 1}, variant{Name: "upsert", Strategy: "upsert"}, 1},
		{"floor", result{Scenario: scSeed, ErrorCount: 1}, floor, 0},
		{"a limit's bound broken in the record", result{Scenario: scLimits, Client: &admissionCheck{},
			Record: &admissionCheck{Admitted: 6, MaxAllowed: 6, Violations: 1}}, limitVariants()[2], 1},
		{"limits errors", result{Scenario: scLimits, ErrorCount: 1}, limitVariants()[1], 1},
		{"cost errors: reported", result{Scenario: scCostHot, ErrorCount: 1}, limitVariants()[1], 0},
	}
	for _, tt := range tests {
		got := failures(&tt.res, tt.v)
		if len(got) != tt.want {
			t.Errorf("%s: %q, want %d failures", tt.name, got, tt.want)
		}
		if tt.v.Limits != "" && tt.res.Record != nil && len(got) > 0 && !strings.Contains(got[0], "over a limit's bound") {
			t.Errorf("%s: %q does not say a limit's bound was broken", tt.name, got)
		}
	}
}
