package pglimitprom

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// poolCollector reads a pgx pool's statistics at scrape time.
type poolCollector struct {
	pool *pgxpool.Pool

	maxConns          *prometheus.Desc
	totalConns        *prometheus.Desc
	acquiredConns     *prometheus.Desc
	idleConns         *prometheus.Desc
	constructingConns *prometheus.Desc
	acquires          *prometheus.Desc
	acquireSeconds    *prometheus.Desc
	emptyAcquires     *prometheus.Desc
	emptyWaitSeconds  *prometheus.Desc
	canceledAcquires  *prometheus.Desc
	newConns          *prometheus.Desc
	lifetimeDestroys  *prometheus.Desc
	idleDestroys      *prometheus.Desc
}

// NewPoolCollector returns a collector of pool's statistics under
// pglimit_pool_*, labelled pool=name so that several pools can be told apart.
func NewPoolCollector(pool *pgxpool.Pool, name string) prometheus.Collector {
	labels := prometheus.Labels{"pool": name}
	desc := func(metric, help string) *prometheus.Desc {
		return prometheus.NewDesc("pglimit_pool_"+metric, help, nil, labels)
	}
	return &poolCollector{
		pool:              pool,
		maxConns:          desc("max_connections", "Maximum size of the pool."),
		totalConns:        desc("connections", "Connections in the pool: acquired, idle and being opened."),
		acquiredConns:     desc("acquired_connections", "Connections in use."),
		idleConns:         desc("idle_connections", "Idle connections."),
		constructingConns: desc("constructing_connections", "Connections being opened."),
		acquires:          desc("acquires_total", "Successful acquires of a connection."),
		acquireSeconds:    desc("acquire_duration_seconds_total", "Total time spent acquiring connections."),
		emptyAcquires:     desc("empty_acquires_total", "Acquires that had to wait for a connection because none was idle."),
		emptyWaitSeconds:  desc("empty_acquire_wait_seconds_total", "Total time acquires waited because no connection was idle."),
		canceledAcquires:  desc("canceled_acquires_total", "Acquires given up because their context ended."),
		newConns:          desc("new_connections_total", "Connections opened."),
		lifetimeDestroys:  desc("max_lifetime_destroys_total", "Connections closed for exceeding MaxConnLifetime."),
		idleDestroys:      desc("max_idle_destroys_total", "Connections closed for exceeding MaxConnIdleTime."),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch,
		c.maxConns, c.totalConns, c.acquiredConns, c.idleConns, c.constructingConns,
		c.acquires, c.acquireSeconds, c.emptyAcquires, c.emptyWaitSeconds,
		c.canceledAcquires, c.newConns, c.lifetimeDestroys, c.idleDestroys,
	)
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s, out := c.pool.Stat(), sampler(ch)
	out.gauge(c.maxConns, float64(s.MaxConns()))
	out.gauge(c.totalConns, float64(s.TotalConns()))
	out.gauge(c.acquiredConns, float64(s.AcquiredConns()))
	out.gauge(c.idleConns, float64(s.IdleConns()))
	out.gauge(c.constructingConns, float64(s.ConstructingConns()))
	out.counter(c.acquires, float64(s.AcquireCount()))
	out.counter(c.acquireSeconds, s.AcquireDuration().Seconds())
	out.counter(c.emptyAcquires, float64(s.EmptyAcquireCount()))
	out.counter(c.emptyWaitSeconds, s.EmptyAcquireWaitTime().Seconds())
	out.counter(c.canceledAcquires, float64(s.CanceledAcquireCount()))
	out.counter(c.newConns, float64(s.NewConnsCount()))
	out.counter(c.lifetimeDestroys, float64(s.MaxLifetimeDestroyCount()))
	out.counter(c.idleDestroys, float64(s.MaxIdleDestroyCount()))
}
