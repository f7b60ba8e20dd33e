// Package pglimitprom exports Prometheus metrics for pglimit limiters, the
// pgx pool they run on, and the cleanup job.
//
// # Usage
//
//	m, err := pglimitprom.New(prometheus.DefaultRegisterer, nil)
//	lim, err := pglimit.New(pool, &pglimit.Config{Cooldown: 2 * time.Second, Observer: m}) // counts and times every decision
//	sem, err := pglimitsem.New(pool, &pglimitsem.Config{Namespace: "exports", Slots: 2, Observe: m.ObserveSemaphore})
//	prometheus.MustRegister(pglimitprom.NewPoolCollector(pool, "main"))
//	prometheus.MustRegister(pglimitprom.NewCleanerCollector(cleaner, "public"))
//
// # Metrics
//
//	pglimit_decisions_total{limiter,strategy,outcome}    counter; outcome: admitted, refused, error, invalid,
//	                                                     canceled (the caller's context was cancelled: no error)
//	pglimit_decision_duration_seconds{limiter,strategy,outcome}
//	                                                     histogram (classic buckets, see DefaultBuckets)
//	pglimit_errors_total{limiter,strategy,kind}          counter; kind: a SQLSTATE such as 57P01, or timeout,
//	                                                     connect, network, other
//	pglimit_key_decisions_total{limiter,strategy,key,outcome}
//	                                                     counter, only with Options.MaxKeys > 0
//	pglimit_pool_*{pool}                                 the pgx pool's statistics (NewPoolCollector)
//	pglimit_cleanup_*{cleaner}                           a pglimitclean.Cleaner's statistics (NewCleanerCollector):
//	                                                     runs_total, batches_total, rows_deleted_total,
//	                                                     errors_total (counters), last_success_timestamp_seconds
//	                                                     (0 before the first success), last_duration_seconds,
//	                                                     leader (1 on the instance that leads, else 0)
//
// The limiter label is the limiter's namespace ([pglimit.Policy]) and
// strategy its strategy, as the limiter reports them to its observer
// ([pglimit.Config.Observer], which m is: [Metrics.EndDecision]); one
// Metrics serves every limiter. A limiter's series are all there, at
// zero, from its first decision on. A semaphore's
// acquisitions ([Metrics.ObserveSemaphore]) count as decisions too, under
// its namespace and the strategy "semaphore": a key whose slots are all
// held is a refusal. Namespaces are
// configuration, not user input: the label is bounded by the number of
// limiters the application creates. Every decision method is counted (Allow,
// AllowN, AllowTx, AllowTxN, AllowAtMost, Reserve); Peek consumes nothing and
// is no decision, so only its errors are counted.
//
// A key is usually a user id: a label per key is unbounded, so the per-key
// counter exists only when asked for, and then for at most [Options.MaxKeys]
// distinct keys; later keys are counted under "other".
package pglimitprom
