package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/pglimit/cooldown/pglimit"
)

// given says which parts of the limiter the flags and the environment
// describe; the namespace is given when it is not empty. What is not given
// comes from the policy the limiter recorded.
type given struct {
	strategy  bool // -strategy, PGLIMIT_STRATEGY
	limits    bool // -limit, -cooldown, PGLIMIT_LIMITS
	overrides bool // -overrides, PGLIMIT_OVERRIDES
}

// resolve checks the limiter the flags describe against the policy its
// schema recorded (pglimit.RecordedPolicies), or, where they describe no
// limits, takes the recorded one. A description that disagrees with the
// latest recorded policy, and with the one before it, is refused naming
// the difference; so is a namespace that recorded none, naming those that
// did, closest first. Notes go to stderr: the policy recorded before the
// latest, which a rolling deploy may still run, and a schema that records
// none (migrated before 00011), whose description is then taken as given.
func (o *options) resolve(ctx context.Context, db pglimit.DB, stderr io.Writer) error {
	recs, err := pglimit.RecordedPolicies(ctx, db, o.cfg.Schema)
	if errors.Is(err, pglimit.ErrInvalidConfig) && o.given.limits {
		fmt.Fprintf(stderr, "pglimit: warning: the limiter described is not checked: %s\n", strings.TrimPrefix(err.Error(), "pglimit: "))
		return nil
	}
	if err != nil {
		return err
	}
	var want pglimit.Policy
	ns := o.cfg.Namespace
	if o.given.limits {
		lim, err := pglimit.New(db, &o.cfg) // reads nothing: fills in the defaults, derives the namespace
		if err != nil {
			return err
		}
		want, ns = lim.Policy(), lim.Policy().Namespace
	}
	var names []string // the namespaces recorded, once each
	for _, r := range recs {
		if r.Latest && !slices.Contains(names, r.Namespace) {
			names = append(names, r.Namespace)
		}
	}
	if ns == "" {
		if len(names) != 1 {
			return usageError{fmt.Errorf("no namespace given (-namespace, PGLIMIT_NAMESPACE), and schema %q records %d: %s", schemaName(o.cfg.Schema), len(names), strings.Join(names, ", "))}
		}
		ns = names[0]
	}
	var mine, other []pglimit.RecordedPolicy
	for _, r := range recs {
		switch {
		case r.Namespace != ns:
		case o.given.strategy && r.Strategy != o.cfg.Strategy:
			other = append(other, r)
		default:
			mine = append(mine, r)
		}
	}
	switch {
	case len(mine) == 0 && len(other) > 0:
		return usageError{fmt.Errorf("namespace %q recorded its policy on strategy %s, not %s: pass -strategy %s", ns, other[0].Strategy, o.cfg.Strategy, other[0].Strategy)}
	case len(mine) == 0:
		return usageError{fmt.Errorf("namespace %q has no recorded policy in schema %q (a limiter records its own at its first decision); namespaces recorded, closest first: %s",
			ns, schemaName(o.cfg.Schema), strings.Join(closest(ns, names), ", "))}
	case slices.ContainsFunc(mine, func(r pglimit.RecordedPolicy) bool { return r.Table != mine[0].Table }):
		return usageError{fmt.Errorf("namespace %q recorded policies on tables %s and %s: pass -strategy", ns, mine[0].Table, mine[len(mine)-1].Table)}
	}
	latest := mine[0]
	var previous *pglimit.RecordedPolicy
	if len(mine) > 1 {
		previous = &mine[1]
	}
	o.cfg.Namespace, o.cfg.Strategy = ns, latest.Strategy
	if !o.given.limits {
		o.cfg.Limits, o.cfg.Cooldown = configLimits(latest.Limits), 0
		if !o.given.overrides {
			o.cfg.Overrides = latest.Overrides
		}
		want = latest.Policy
	}
	diff := differences(want, o.cfg.Overrides, latest)
	switch {
	case len(diff) == 0 && previous != nil:
		fmt.Fprintf(stderr, "pglimit: note: namespace %q recorded another policy before the latest (%s), last at %s, which a rolling deploy may still run: %s\n",
			ns, when(latest.Recorded), when(previous.Recorded), words(previous.Limits))
		return nil
	case len(diff) == 0:
		return nil
	case previous != nil && len(differences(want, o.cfg.Overrides, *previous)) == 0:
		fmt.Fprintf(stderr, "pglimit: warning: the limiter described is namespace %q's policy before the latest, last recorded at %s; the latest, recorded at %s, differs: %s\n",
			ns, when(previous.Recorded), when(latest.Recorded), strings.Join(diff, "; "))
		return nil
	}
	return usageError{fmt.Errorf("the limiter described is not the one namespace %q recorded at %s: %s; leave out -limit, -cooldown and PGLIMIT_LIMITS to use the recorded one",
		ns, when(latest.Recorded), strings.Join(diff, "; "))}
}

// configLimits is limits as a Config takes them: a Policy gives a calendar
// window the nominal Period of its unit, which a Config leaves to the
// calendar.
func configLimits(limits []pglimit.Limit) []pglimit.Limit {
	out := slices.Clone(limits)
	for i := range out {
		if out[i].Calendar != "" {
			out[i].Period = 0
		}
	}
	return out
}

func schemaName(s string) string {
	if s == "" {
		return "public"
	}
	return s
}

// differences says how the limits want, with per-key limits or not
// (overrides), differ from the recorded policy r; nil if they do not.
func differences(want pglimit.Policy, overrides bool, r pglimit.RecordedPolicy) []string {
	var diff []string
	switch {
	case overrides && !r.Overrides:
		diff = append(diff, "per-key limits: described (-overrides), the limiter reads none (leave out -overrides)")
	case !overrides && r.Overrides:
		diff = append(diff, "per-key limits: the limiter reads them, the description does not (pass -overrides, or set PGLIMIT_OVERRIDES=true)")
	}
	if len(want.Limits) != len(r.Limits) {
		return append(diff, fmt.Sprintf("limits: described %d (%s), recorded %d (%s)", len(want.Limits), words(want.Limits), len(r.Limits), words(r.Limits)))
	}
	for i := range want.Limits {
		if w, g := spec(want.Limits[i]), spec(r.Limits[i]); w != g {
			diff = append(diff, fmt.Sprintf("limit %d: described %s, recorded %s", i+1, w, g))
		}
	}
	return diff
}

// spec is a limit as -limit takes it, with its default fields written out:
// per-minute=5/1m0s,burst=3.
func spec(l pglimit.Limit) string {
	s := fmt.Sprintf("%s=%d/%s", l.Name, l.Rate, period(l))
	switch {
	case l.Algorithm == pglimit.GCRA:
		s += fmt.Sprintf(",burst=%d", l.Burst)
	case l.Calendar != "":
		s += ",tz=" + l.TimeZone
	case l.Algorithm == pglimit.SlidingWindow:
		s += ",sliding"
	default:
		s += ",fixed"
	}
	if l.Debt != 0 {
		s += fmt.Sprintf(",debt=%d", l.Debt)
	}
	return s
}

// words is limits as -limit takes them, separated by "; ".
func words(limits []pglimit.Limit) string {
	s := make([]string, len(limits))
	for i, l := range limits {
		s[i] = spec(l)
	}
	return strings.Join(s, "; ")
}

// closest is names, those nearest to name (by edit distance) first.
func closest(name string, names []string) []string {
	out := slices.Clone(names)
	slices.SortStableFunc(out, func(a, b string) int {
		if d := distance(name, a) - distance(name, b); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	return out
}

// distance is the Levenshtein distance between a and b, in bytes.
func distance(a, b string) int {
	row := make([]int, len(b)+1)
	for j := range row {
		row[j] = j
	}
	for i := 1; i <= len(a); i++ {
		diag := row[0]
		row[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			diag, row[j] = row[j], min(row[j]+1, row[j-1]+1, diag+cost)
		}
	}
	return row[len(b)]
}
