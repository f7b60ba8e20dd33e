package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/cooldown/pglimit"
)

// Latencies are recorded in microseconds, from 1 µs to 5 minutes (longer
// is clamped), which bounds each histogram's memory whatever the run's
// length. Overall figures keep 3 significant digits (0.1%); the per-window
// ones behind the charts keep 2 to stay small.
const (
	histLowest  = 1
	histHighest = int64(5 * time.Minute / time.Microsecond)
)

// Error classes besides SQLSTATE codes and HTTP statuses.
const (
	errTimeout  = "timeout"
	errCanceled = "canceled"
	errOther    = "other"
)

// outcome is what a decision came to, as the load generator sees it.
type outcome struct {
	allowed bool
	err     error
}

// recorder collects one run's decisions. Counters the progress line reads
// are atomics; the histograms and per-key admissions sit behind a mutex,
// whose cost is the same for the floor and for every strategy.
type recorder struct {
	start     time.Time
	window    time.Duration
	trackKeys bool

	decisions, admitted, errored atomic.Int64

	mu      sync.Mutex
	hist    *hdrhistogram.Histogram
	windows []*window
	errs    map[string]int64
	keys    map[string][]admission
	last    time.Duration // latest receive offset
}

// window holds the decisions whose request was sent within one time slice.
type window struct {
	hist                      *hdrhistogram.Histogram
	admitted, refused, errors int64
}

func newRecorder(start time.Time, window time.Duration, trackKeys bool) *recorder {
	return &recorder{
		start:     start,
		window:    window,
		trackKeys: trackKeys,
		hist:      hdrhistogram.New(histLowest, histHighest, 3),
		errs:      map[string]int64{},
		keys:      map[string][]admission{},
	}
}

// record notes one request for key sent at sent and answered at received.
// Latency is measured from sent, which for the open-loop load is the
// scheduled arrival time, so a slow server cannot hide queueing.
func (r *recorder) record(key string, sent, received time.Time, o outcome) {
	lat := max(received.Sub(sent).Microseconds(), histLowest)
	lat = min(lat, histHighest)
	s, rcv := sent.Sub(r.start), received.Sub(r.start)
	i := max(int(s/r.window), 0)

	r.decisions.Add(1)
	switch {
	case o.err != nil:
		r.errored.Add(1)
	case o.allowed:
		r.admitted.Add(1)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.hist.RecordValue(lat) // in range by construction
	for len(r.windows) <= i {
		r.windows = append(r.windows, &window{hist: hdrhistogram.New(histLowest, histHighest, 2)})
	}
	w := r.windows[i]
	_ = w.hist.RecordValue(lat)
	r.last = max(r.last, rcv)
	switch {
	case o.err != nil:
		w.errors++
		r.errs[classify(o.err)]++
	case o.allowed:
		w.admitted++
		if r.trackKeys {
			r.keys[key] = append(r.keys[key], admission{sent: s, received: rcv})
		}
	default:
		w.refused++
	}
}

// httpStatusError is an HTTP answer that is neither an admission nor a
// refusal.
type httpStatusError struct{ code int }

func (e *httpStatusError) Error() string { return fmt.Sprintf("HTTP status %d", e.code) }

// classify names an error for the report: its SQLSTATE when the database
// raised it, else a coarse class.
func classify(err error) string {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pgErr.Code
	}
	if he, ok := errors.AsType[*httpStatusError](err); ok {
		return fmt.Sprintf("http-%d", he.code)
	}
	if errors.Is(err, pglimit.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return errTimeout
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return errTimeout
	}
	if errors.Is(err, context.Canceled) {
		return errCanceled
	}
	return errOther
}

// latency summarises a histogram in milliseconds.
type latency struct {
	P50  float64 `json:"p50_ms"`
	P95  float64 `json:"p95_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

func summarise(h *hdrhistogram.Histogram) latency {
	if h.TotalCount() == 0 {
		return latency{}
	}
	q := func(p float64) float64 { return float64(h.ValueAtPercentile(p)) / 1000 }
	return latency{P50: q(50), P95: q(95), P99: q(99), Max: float64(h.Max()) / 1000, Mean: h.Mean() / 1000}
}

// point is one window of the timeline behind the latency-over-time charts.
type point struct {
	T        float64 `json:"t_s"`
	Count    int64   `json:"count"`
	Admitted int64   `json:"admitted"`
	Errors   int64   `json:"errors"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	Max      float64 `json:"max_ms"`
}

// timeline returns one point per window, at the window's end.
func (r *recorder) timeline() []point {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]point, len(r.windows))
	for i, w := range r.windows {
		l := summarise(w.hist)
		out[i] = point{
			T:        (time.Duration(i+1) * r.window).Seconds(),
			Count:    w.admitted + w.refused + w.errors,
			Admitted: w.admitted,
			Errors:   w.errors,
			P50:      l.P50, P99: l.P99, Max: l.Max,
		}
	}
	return out
}
