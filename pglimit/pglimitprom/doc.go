// Package pglimitprom exports Prometheus metrics for pglimit limiters and
// the pgx pool they run on.
//
// # Usage
//
//	m, err := pglimitprom.New(prometheus.DefaultRegisterer, nil)
//	lim = m.Instrument(lim, pglimit.Upsert) // counts and times every decision
//	prometheus.MustRegister(pglimitprom.NewPoolCollector(pool, "main"))
//
// # Metrics
//
//	pglimit_decisions_total{strategy,outcome}            counter; outcome: admitted, refused, error, invalid
//	pglimit_decision_duration_seconds{strategy,outcome}  histogram (classic buckets, see DefaultBuckets)
//	pglimit_errors_total{strategy,kind}                  counter; kind: a SQLSTATE such as 57P01, or timeout,
//	                                                     canceled, connect, network, other
//	pglimit_key_decisions_total{strategy,key,outcome}    counter, only with Options.MaxKeys > 0
//	pglimit_pool_*{pool}                                 the pgx pool's statistics (NewPoolCollector)
//
// A key is usually a user id: a label per key is unbounded, so the per-key
// counter exists only when asked for, and then for at most [Options.MaxKeys]
// distinct keys; later keys are counted under "other".
package pglimitprom
