package pglimitprom

// CLEANUP METRICS GO HERE.
//
// The leader-elected cleaner (pglimit.Cleaner) is being built separately;
// once it lands, add a collector here that reads its Stats() at scrape time,
// in the style of poolCollector, exporting:
//
//	pglimit_cleanup_rows_deleted_total              counter
//	pglimit_cleanup_batches_total                   counter
//	pglimit_cleanup_last_success_timestamp_seconds  gauge (Unix time)
//	pglimit_cleanup_leader                          gauge, 1 on the instance that leads
//
// and the matching dashboard panels (rows deleted, leader by instance).
