package pglimitprom

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglimit/cooldown/pglimit/pglimitclean"
)

// cleanerCollector reads a pglimitclean.Cleaner's statistics at scrape time.
type cleanerCollector struct {
	cleaner interface{ Stats() pglimitclean.Stats }

	runs         *prometheus.Desc
	batches      *prometheus.Desc
	rowsDeleted  *prometheus.Desc
	errors       *prometheus.Desc
	lastSuccess  *prometheus.Desc
	lastDuration *prometheus.Desc
	leader       *prometheus.Desc
}

// NewCleanerCollector returns a collector of a cleaner's statistics
// ([pglimitclean.Cleaner.Stats]) under pglimit_cleanup_*, labelled
// cleaner=name. The label tells several cleaners apart; the schema a
// cleaner cleans is a good name.
//
// pglimit_cleanup_last_success_timestamp_seconds is 0 until the cleaner's
// first successful run, rather than absent: an alert on
// time() - pglimit_cleanup_last_success_timestamp_seconds then also fires
// for cleaners that never succeed. Graphs of the age filter it with > 0.
func NewCleanerCollector(c interface{ Stats() pglimitclean.Stats }, name string) prometheus.Collector {
	labels := prometheus.Labels{"cleaner": name}
	desc := func(metric, help string) *prometheus.Desc {
		return prometheus.NewDesc("pglimit_cleanup_"+metric, help, nil, labels)
	}
	return &cleanerCollector{
		cleaner:      c,
		runs:         desc("runs_total", "Cleanup runs this instance started as leader."),
		batches:      desc("batches_total", "Cleanup DELETE batches that committed."),
		rowsDeleted:  desc("rows_deleted_total", "Rows deleted by the cleanup, whose limits had ended more than the retention ago."),
		errors:       desc("errors_total", "Cleanup batches that failed; a failure ends its run."),
		lastSuccess:  desc("last_success_timestamp_seconds", "Unix time at which the last cleanup run without error ended; 0 before the first."),
		lastDuration: desc("last_duration_seconds", "How long the last finished cleanup run took; 0 before the first."),
		leader:       desc("leader", "1 while this instance leads the cleanup (only the leader deletes), else 0."),
	}
}

func (c *cleanerCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, c.runs, c.batches, c.rowsDeleted, c.errors, c.lastSuccess, c.lastDuration, c.leader)
}

func (c *cleanerCollector) Collect(ch chan<- prometheus.Metric) {
	s, out := c.cleaner.Stats(), sampler(ch)
	out.counter(c.runs, float64(s.Runs))
	out.counter(c.batches, float64(s.Batches))
	out.counter(c.rowsDeleted, float64(s.RowsDeleted))
	out.counter(c.errors, float64(s.Errors))
	var lastSuccess, leader float64
	if !s.LastSuccess.IsZero() {
		lastSuccess = unixSeconds(s.LastSuccess)
	}
	if s.Leader {
		leader = 1
	}
	out.gauge(c.lastSuccess, lastSuccess)
	out.gauge(c.lastDuration, s.LastDuration.Seconds())
	out.gauge(c.leader, leader)
}

// unixSeconds is t as a Unix timestamp; adding the parts keeps a whole
// second exact, where float64(t.UnixNano())/1e9 would not.
func unixSeconds(t time.Time) float64 {
	return float64(t.Unix()) + float64(t.Nanosecond())/1e9
}
