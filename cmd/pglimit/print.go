package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
	"github.com/pglimit/cooldown/pglimit/pglimithealth"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

// printer writes a command's answer as tables for people, or as JSON.
type printer struct {
	w    io.Writer
	json bool
}

// The JSON forms: durations in milliseconds, times in RFC 3339.
type (
	jsonLimit struct {
		Name         string     `json:"name"`
		Rule         string     `json:"rule"`
		Rate         int        `json:"rate"`
		Period       string     `json:"period"`
		Burst        int        `json:"burst,omitempty"`
		Algorithm    string     `json:"algorithm"`
		Remaining    int        `json:"remaining"`
		RetryAfterMS int64      `json:"retry_after_ms"`
		ResetAfterMS int64      `json:"reset_after_ms"`
		WindowEnd    *time.Time `json:"window_end,omitempty"`
	}
	jsonOwn struct {
		Key     string     `json:"key"`
		Limits  []jsonRate `json:"limits"`
		Expires *time.Time `json:"expires,omitempty"`
		Updated *time.Time `json:"updated,omitempty"`
	}
	jsonRate struct {
		Name  string `json:"name"`
		Rate  int    `json:"rate,omitempty"`
		Burst int    `json:"burst,omitempty"`
	}
	jsonState struct {
		Key     string      `json:"key"`
		At      time.Time   `json:"at"`
		Refused bool        `json:"refused"`
		Limits  []jsonLimit `json:"limits"`
		Own     *jsonOwn    `json:"own"`
		Invalid string      `json:"invalid,omitempty"`
	}
)

func (p printer) encode(v any) error {
	enc := json.NewEncoder(p.w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func ownJSON(o *pglimit.KeyLimits) *jsonOwn {
	if o == nil {
		return nil
	}
	j := &jsonOwn{Key: o.Key, Limits: []jsonRate{}, Expires: timePtr(o.Expires), Updated: timePtr(o.Updated)}
	for _, l := range o.Limits {
		j.Limits = append(j.Limits, jsonRate{Name: l.Name, Rate: l.Rate, Burst: l.Burst})
	}
	return j
}

func stateJSON(s pglimit.KeyState) jsonState {
	j := jsonState{Key: s.Key, At: s.At.UTC(), Refused: s.Refused(), Limits: []jsonLimit{}, Own: ownJSON(s.Own)}
	if s.Invalid != nil {
		j.Invalid = s.Invalid.Error()
	}
	for _, l := range s.Limits {
		j.Limits = append(j.Limits, jsonLimit{
			Name: l.Limit.Name, Rule: rule(l.Limit), Rate: l.Limit.Rate, Period: period(l.Limit), Burst: l.Limit.Burst,
			Algorithm: l.Limit.Algorithm.String(), Remaining: l.Remaining,
			RetryAfterMS: l.RetryAfter.Milliseconds(), ResetAfterMS: l.ResetAfter.Milliseconds(), WindowEnd: timePtr(l.WindowEnd),
		})
	}
	return j
}

// period is a limit's period as the command takes it: a calendar unit, or
// a duration.
func period(l pglimit.Limit) string {
	if l.Calendar != "" {
		return l.Calendar
	}
	return l.Period.String()
}

// rule is a limit in words: "5 per 1m0s, burst 3", "1000 per day (Europe/Paris)".
func rule(l pglimit.Limit) string {
	s := fmt.Sprintf("%d per %s", l.Rate, period(l))
	switch {
	case l.Algorithm == pglimit.GCRA:
		s += fmt.Sprintf(", burst %d", l.Burst)
	case l.Calendar != "":
		s += " (" + l.TimeZone + ")"
	case l.Algorithm == pglimit.SlidingWindow:
		s += " (sliding)"
	default:
		s += " (fixed)"
	}
	return s
}

// wait is a duration for people: "-" for none, else rounded to what matters.
func wait(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05 MST")
}

func ownWords(o *pglimit.KeyLimits) string {
	var parts []string
	for _, l := range o.Limits {
		var s []string
		if l.Rate > 0 {
			s = append(s, fmt.Sprintf("rate %d", l.Rate))
		}
		if l.Burst > 0 {
			s = append(s, fmt.Sprintf("burst %d", l.Burst))
		}
		parts = append(parts, l.Name+" "+strings.Join(s, " "))
	}
	until := "for good"
	if !o.Expires.IsZero() {
		until = "until " + when(o.Expires)
	}
	return strings.Join(parts, ", ") + ", " + until
}

// table writes s's limits, a row each.
func (p printer) table(s pglimit.KeyState) {
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LIMIT\tRULE\tLEFT\tNEXT UNIT IN\tFULL IN\tWINDOW ENDS")
	for _, l := range s.Limits {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", l.Limit.Name, rule(l.Limit), l.Remaining, wait(l.RetryAfter), wait(l.ResetAfter), when(l.WindowEnd))
	}
	tw.Flush()
}

func (p printer) state(cfg pglimit.Config, s pglimit.KeyState) error {
	if p.json {
		return p.encode(stateJSON(s))
	}
	ns := cfg.Namespace
	fmt.Fprintf(p.w, "key %q", s.Key)
	if ns != "" {
		fmt.Fprintf(p.w, " of namespace %q", ns)
	}
	fmt.Fprintf(p.w, ", at %s (database time)\n", when(s.At))
	p.table(s)
	if s.Own != nil {
		fmt.Fprintf(p.w, "own limits: %s\n", ownWords(s.Own))
	}
	var retry time.Duration
	for _, l := range s.Limits {
		retry = max(retry, l.RetryAfter)
	}
	if s.Refused() {
		fmt.Fprintf(p.w, "refused now: a request of 1 unit may pass in %s\n", wait(retry))
	} else {
		fmt.Fprintln(p.w, "refused now: no")
	}
	return nil
}

func (p printer) limited(n, max int, states []pglimit.KeyState) error {
	if p.json {
		out := make([]jsonState, len(states))
		for i, s := range states {
			out[i] = stateJSON(s)
		}
		return p.encode(map[string]any{"n": n, "keys": out})
	}
	if len(states) == 0 {
		fmt.Fprintf(p.w, "no key would refuse %d unit(s) now\n", n)
		return nil
	}
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tLIMIT\tLEFT\tNEXT UNIT IN\tFULL IN\tOWN LIMITS")
	for _, s := range states {
		for i, l := range s.Limits {
			key, own := "", ""
			if i == 0 {
				key = s.Key
				if s.Own != nil {
					own = "yes"
				}
				if s.Invalid != nil {
					own = "unusable: " + s.Invalid.Error()
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", key, l.Limit.Name, l.Remaining, wait(l.RetryAfter), wait(l.ResetAfter), own)
		}
	}
	tw.Flush()
	if len(states) == max {
		fmt.Fprintf(p.w, "%d keys shown, there may be more: -after %q for the next page\n", max, states[len(states)-1].Key)
	}
	return nil
}

func (p printer) own(max int, own []pglimit.KeyLimits) error {
	if p.json {
		out := make([]*jsonOwn, len(own))
		for i := range own {
			out[i] = ownJSON(&own[i])
		}
		return p.encode(map[string]any{"keys": out})
	}
	if len(own) == 0 {
		fmt.Fprintln(p.w, "no key has limits of its own")
		return nil
	}
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tOWN LIMITS\tSET")
	for i := range own {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", own[i].Key, ownWords(&own[i]), when(own[i].Updated))
	}
	tw.Flush()
	if len(own) == max {
		fmt.Fprintf(p.w, "%d keys shown, there may be more: -after %q for the next page\n", max, own[len(own)-1].Key)
	}
	return nil
}

// done reports a write (name) on key, and the key's state after it (nil
// when the strategy cannot show it).
func (p printer) done(name, key string, dryRun bool, s *pglimit.KeyState) error {
	what := map[string]string{
		"reset": "reset", "overrides set": "set own limits of", "overrides clear": "cleared own limits of",
	}[name]
	if p.json {
		out := map[string]any{"command": name, "key": key, "dry_run": dryRun}
		if s != nil {
			out["state"] = stateJSON(*s)
		}
		return p.encode(out)
	}
	if dryRun {
		fmt.Fprintf(p.w, "dry run: would have %s %q; rolled back, nothing changed\n", what, key)
	} else {
		fmt.Fprintf(p.w, "%s %q\n", what, key)
	}
	if s != nil {
		if dryRun {
			fmt.Fprintln(p.w, "it would then stand:")
		}
		p.table(*s)
		if s.Own != nil {
			fmt.Fprintf(p.w, "own limits: %s\n", ownWords(s.Own))
		}
	}
	return nil
}

func (p printer) cleaner(st pglimitclean.State) error {
	if p.json {
		type table struct {
			Table     string `json:"table"`
			Bytes     int64  `json:"bytes"`
			Rows      int64  `json:"rows_estimate"`
			Due       int64  `json:"due"`
			OverdueMS int64  `json:"overdue_ms"`
		}
		type leader struct {
			PID         int        `json:"pid"`
			Application string     `json:"application"`
			Connected   *time.Time `json:"connected,omitempty"`
			Active      *time.Time `json:"active,omitempty"`
		}
		out := struct {
			Leader *leader `json:"leader"`
			Tables []table `json:"tables"`
		}{Tables: []table{}}
		if l := st.Leader; l != nil {
			out.Leader = &leader{l.PID, l.Application, timePtr(l.Connected), timePtr(l.Active)}
		}
		for _, t := range st.Tables {
			out.Tables = append(out.Tables, table{t.Table, t.Bytes, t.Rows, t.Due, t.Overdue.Milliseconds()})
		}
		return p.encode(out)
	}
	if l := st.Leader; l != nil {
		fmt.Fprintf(p.w, "leader: pid %d", l.PID)
		if l.Application != "" {
			fmt.Fprintf(p.w, " (%s)", l.Application)
		}
		if !l.Connected.IsZero() {
			fmt.Fprintf(p.w, ", connected %s, last active %s", when(l.Connected), when(l.Active))
		}
		fmt.Fprintln(p.w)
	} else {
		fmt.Fprintln(p.w, "leader: none (no instance runs a Cleaner of these tables, or one is taking over)")
	}
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tSIZE\tROWS (EST.)\tDUE\tOLDEST DUE SINCE")
	for _, t := range st.Tables {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", t.Table, size(t.Bytes), t.Rows, t.Due, wait(t.Overdue))
	}
	return tw.Flush()
}

func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d kB", n/1024)
}

// health prints each health throttle's rate and why it is there.
func (p printer) health(name string, states []pglimithealth.State) error {
	if p.json {
		// Value is null where it is not finite: a standby that could not
		// be read counts as infinitely behind (+Inf in the table).
		type throttle struct {
			Name      string    `json:"name"`
			Rate      int64     `json:"rate"`
			Since     time.Time `json:"since"`
			Over      bool      `json:"over"`
			Signal    string    `json:"signal"`
			Value     *float64  `json:"value"`
			Threshold float64   `json:"threshold"`
			SampledAt time.Time `json:"sampled_at"`
			Leader    string    `json:"leader"`
			Samples   int64     `json:"samples"`
		}
		out := []throttle{}
		for _, s := range states {
			var value *float64
			if !math.IsInf(s.Value, 0) && !math.IsNaN(s.Value) {
				value = &s.Value
			}
			out = append(out, throttle{s.Name, s.Rate, s.Since, s.Over, string(s.Signal), value, s.Threshold, s.SampledAt, s.Leader, s.Samples})
		}
		return p.encode(out)
	}
	if len(states) == 0 {
		if name != "" {
			fmt.Fprintf(p.w, "no health throttle %q has sampled yet\n", name)
		} else {
			fmt.Fprintln(p.w, "no health throttle has sampled yet")
		}
		return nil
	}
	tw := tabwriter.NewWriter(p.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "THROTTLE\tRATE\tSINCE\tBECAUSE\tSAMPLED\tBY")
	for _, s := range states {
		cmp := "<="
		if s.Over {
			cmp = ">"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s %s %s %s\t%s\t%s\n", s.Name, s.Rate, when(s.Since), s.Signal,
			strconv.FormatFloat(s.Value, 'g', 4, 64), cmp, strconv.FormatFloat(s.Threshold, 'g', 4, 64), when(s.SampledAt), s.Leader)
	}
	return tw.Flush()
}

// usageJSON is a key's period as -json prints it.
type usageJSON struct {
	Key           string    `json:"key"`
	At            time.Time `json:"at"`
	PeriodStart   time.Time `json:"period_start"`
	PeriodEnd     time.Time `json:"period_end"`
	Used          int64     `json:"used"`
	FromAllowance int64     `json:"from_allowance"`
	FromCredits   int64     `json:"from_credits"`
	Overage       int64     `json:"overage"`
	Allowance     int64     `json:"allowance"`
	HardCap       int64     `json:"hard_cap"`
	CreditsLeft   int64     `json:"credits_left"`
}

// toUsageJSON is key's period u as -json prints it.
func toUsageJSON(key string, u pglimitquota.Usage) usageJSON {
	return usageJSON{key, u.Now, u.PeriodStart, u.PeriodEnd, u.Used, u.FromAllowance, u.FromCredits, u.Overage, u.Allowance, u.HardCap, u.CreditsLeft}
}

// usage prints key's billing period (pglimitquota.Quota.Usage).
func (p printer) usage(key string, u pglimitquota.Usage) error {
	if p.json {
		return p.encode(toUsageJSON(key, u))
	}
	fmt.Fprintf(p.w, "%s: period %s to %s (ends in %s)\n", key, u.PeriodStart.UTC().Format(time.RFC3339), u.PeriodEnd.UTC().Format(time.RFC3339), wait(u.PeriodEnd.Sub(u.Now)))
	fmt.Fprintf(p.w, "used %d: %d of the allowance of %d, %d from credits, %d overage (hard cap %d)\n", u.Used, u.FromAllowance, u.Allowance, u.FromCredits, u.Overage, u.HardCap)
	fmt.Fprintf(p.w, "credits left %d\n", u.CreditsLeft)
	return nil
}

// forgot reports a key forgotten (or, dryRun, that would have been),
// with its period u as it stood before.
func (p printer) forgot(key string, dryRun bool, u pglimitquota.Usage) error {
	if p.json {
		return p.encode(struct {
			Command string    `json:"command"`
			Key     string    `json:"key"`
			DryRun  bool      `json:"dry_run"`
			Before  usageJSON `json:"before"`
		}{"forget", key, dryRun, toUsageJSON(key, u)})
	}
	if dryRun {
		fmt.Fprintf(p.w, "dry run: would have forgotten %q (its plan, counters, credits and ids); rolled back, nothing changed\n", key)
	} else {
		fmt.Fprintf(p.w, "forgot %q (its plan, counters, credits and ids; its threshold events stay until taken)\n", key)
	}
	fmt.Fprintln(p.w, "it stood:")
	return p.usage(key, u)
}
