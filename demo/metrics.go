package main

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglimit/cooldown/pglimit/pglimitprom"
)

// httpMetrics are the demo's own metrics: requests by route, and item
// events by user (bounded, like pglimit's per-key counter).
type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	events   *prometheus.CounterVec
	policy   *prometheus.CounterVec
	users    *pglimitprom.CappedLabel
}

func newHTTPMetrics(reg prometheus.Registerer, cfg config) (*httpMetrics, error) {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "demo_http_requests_total",
			Help: "HTTP requests by route (the ServeMux pattern, or \"unmatched\") and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "demo_http_request_duration_seconds",
			Help:    "HTTP request duration by route.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "demo_item_events_total",
			Help: "Items created and lists served, by user (the first users seen; later ones count as \"other\").",
		}, []string{"event", "user"}),
		policy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "demo_limiter_failures_total",
			Help: "Requests whose limiter decision failed, by what the error policy did: fail_open, fail_closed or unavailable.",
		}, []string{"outcome"}),
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "demo_info",
		Help:        "Always 1; labels describe this instance.",
		ConstLabels: prometheus.Labels{"name": cfg.instance, "strategy": string(cfg.strategy)},
	})
	info.Set(1)
	cooldown := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "demo_cooldown_seconds",
		Help: "The cooldown of GET /items/{user}: at most one admission per user per this many seconds.",
	})
	cooldown.Set(cfg.cooldown.Seconds())
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.events, m.policy, info, cooldown} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	if cfg.maxUsers > 0 {
		m.users = pglimitprom.NewCappedLabel(cfg.maxUsers)
	}
	return m, nil
}

func (m *httpMetrics) itemEvent(event, user string) {
	if m.users == nil {
		user = pglimitprom.OtherKey
	} else {
		user = m.users.Value(user)
	}
	m.events.WithLabelValues(event, user).Inc()
}

// instrument counts and times every request that mux serves. The route is
// read after serving, from the pattern ServeMux stored in the request.
func (m *httpMetrics) instrument(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		mux.ServeHTTP(sw, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		m.requests.WithLabelValues(route, statusLabel(sw.status)).Inc()
		m.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}

// statusWriter remembers the status code written.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the real writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func statusLabel(code int) string {
	if code == 0 {
		code = http.StatusOK // nothing written: net/http sends 200
	}
	return strconv.Itoa(code)
}
