package pglimitprom

import "github.com/prometheus/client_golang/prometheus"

// Helpers for the collectors that read statistics at scrape time.

// describe sends descs, for a collector's Describe.
func describe(ch chan<- *prometheus.Desc, descs ...*prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

// sampler sends constant samples, for a collector's Collect.
type sampler chan<- prometheus.Metric

func (s sampler) gauge(d *prometheus.Desc, v float64) {
	s <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
}

func (s sampler) counter(d *prometheus.Desc, v float64) {
	s <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
}
