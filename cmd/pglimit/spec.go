package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pglimit/cooldown/pglimit"
)

// calendarUnits are the periods that make a limit a calendar window.
var calendarUnits = []string{"minute", "hour", "day", "week", "month", "year"}

// parseLimit reads a limit as the command takes it, the limiter's own
// fields in a line:
//
//	[NAME=]RATE/PERIOD[,burst=N][,debt=N][,fixed|,sliding][,tz=ZONE]
//
// PERIOD is a Go duration (1m, 24h) or a calendar unit (day, month, ...),
// which makes a FixedWindow aligned to the calendar of tz (UTC by
// default). Without burst a GCRA limit has Limit's default burst of 1, as
// Limit{Rate: 5, Period: time.Minute} does: give the application's.
func parseLimit(s string) (pglimit.Limit, error) {
	var l pglimit.Limit
	parts := strings.Split(s, ",")
	head := parts[0]
	if name, rest, ok := strings.Cut(head, "="); ok {
		l.Name, head = name, rest
	}
	rate, period, ok := strings.Cut(head, "/")
	if !ok {
		return l, fmt.Errorf("limit %q: want [NAME=]RATE/PERIOD[,burst=N][,debt=N][,fixed|,sliding][,tz=ZONE]", s)
	}
	var err error
	if l.Rate, err = strconv.Atoi(rate); err != nil {
		return l, fmt.Errorf("limit %q: rate %q is not a whole number", s, rate)
	}
	if slices.Contains(calendarUnits, period) {
		l.Calendar, l.Algorithm = period, pglimit.FixedWindow
	} else if l.Period, err = time.ParseDuration(period); err != nil {
		return l, fmt.Errorf("limit %q: period %q is neither a duration (1m, 24h) nor one of %s", s, period, strings.Join(calendarUnits, ", "))
	}
	for _, opt := range parts[1:] {
		key, val, _ := strings.Cut(opt, "=")
		switch {
		case key == "burst":
			if l.Burst, err = strconv.Atoi(val); err != nil {
				return l, fmt.Errorf("limit %q: burst %q is not a whole number", s, val)
			}
		case key == "debt":
			if l.Debt, err = strconv.Atoi(val); err != nil {
				return l, fmt.Errorf("limit %q: debt %q is not a whole number", s, val)
			}
		case key == "tz" && val != "":
			l.TimeZone = val
		case opt == "fixed":
			l.Algorithm = pglimit.FixedWindow
		case opt == "sliding":
			l.Algorithm = pglimit.SlidingWindow
		default:
			return l, fmt.Errorf("limit %q: unknown option %q (burst=N, debt=N, fixed, sliding, tz=ZONE)", s, opt)
		}
	}
	return l, nil
}

// parseOwn reads a key's own limit for SetKeyLimits: NAME=RATE, NAME=/BURST
// or NAME=RATE/BURST.
func parseOwn(s string) (pglimit.Limit, error) {
	var l pglimit.Limit
	name, val, ok := strings.Cut(s, "=")
	if !ok || name == "" || val == "" {
		return l, fmt.Errorf("own limit %q: want NAME=RATE, NAME=/BURST or NAME=RATE/BURST", s)
	}
	l.Name = name
	rate, burst, _ := strings.Cut(val, "/")
	var err error
	if rate != "" {
		if l.Rate, err = strconv.Atoi(rate); err != nil {
			return l, fmt.Errorf("own limit %q: rate %q is not a whole number", s, rate)
		}
	}
	if burst != "" {
		if l.Burst, err = strconv.Atoi(burst); err != nil {
			return l, fmt.Errorf("own limit %q: burst %q is not a whole number", s, burst)
		}
	}
	return l, nil
}
