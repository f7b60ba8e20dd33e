package pglimit

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The general statement decides for any set of limits, on the Upsert and
// NoWait tables, with the pglimit_decide function the migrations install
// (migrations/00004_general_limits.sql). Its shape is the cooldown's: the
// row's state as the snapshot sees it, and the decision on it, which is the
// answer when it refuses (no lock, no write, and no other evaluation: the
// EXISTS on verdict is a one-time filter that skips locked); else the row
// locked only if the decision, evaluated again on the latest row version,
// admits, and decided once more at the clock read after the lock, which is
// what the UPDATE writes; else, for a key with no row, an advisory lock on
// the key before the clock is read and the INSERT. No row at all means the
// key changed after the snapshot, and the statement is run again.
//
// %[1]s is the table, %[2]s the setting column of the admitting branches,
// %[3]s the lock clause (FOR UPDATE, or FOR UPDATE NOWAIT), %[4]s the
// schema-qualified function. $1 namespace, $2 key, $3 the key's lock class,
// $4 n, $5 mode, $6 the maximum delay in µs, $7 the limits' spec.
const generalAllowSQL = `
WITH current AS (
    SELECT t.state, t.expires_at, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now
    FROM %[1]s AS t WHERE t.namespace = $1 AND t.key = $2
), verdict AS (
    SELECT d.*, c.now FROM current AS c,
        LATERAL %[4]s(c.state, (extract(epoch FROM c.expires_at) * 1000000)::bigint, c.now, $4, $5, $6, $7) AS d
), locked AS (
    SELECT t.state, t.expires_at FROM %[1]s AS t
    WHERE t.namespace = $1 AND t.key = $2
      AND EXISTS (SELECT FROM verdict WHERE allowed)
      AND (%[4]s(t.state, (extract(epoch FROM t.expires_at) * 1000000)::bigint,
                 (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, $4, $5, $6, $7)).allowed
    %[3]s
), stamp AS (
    SELECT l.state, l.expires_at, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now FROM locked AS l
), decided AS (
    SELECT d.*, s.now FROM stamp AS s,
        LATERAL %[4]s(s.state, (extract(epoch FROM s.expires_at) * 1000000)::bigint, s.now, $4, $5, $6, $7) AS d
), updated AS (
    UPDATE %[1]s AS t
    SET state = d.new_state, expires_at = timestamptz 'epoch' + d.new_expires * interval '1 microsecond'
    FROM decided AS d
    WHERE t.namespace = $1 AND t.key = $2 AND d.allowed
    RETURNING 1
), first AS (
    SELECT pg_advisory_xact_lock($3::integer, hashtext($2))
    WHERE NOT EXISTS (SELECT FROM current)
), fresh AS (
    SELECT d.*, s.now
    FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now FROM first) AS s,
        LATERAL %[4]s(NULL, NULL, s.now, $4, $5, $6, $7) AS d
), inserted AS (
    INSERT INTO %[1]s (namespace, key, state, expires_at)
    SELECT $1, $2, f.new_state, timestamptz 'epoch' + f.new_expires * interval '1 microsecond'
    FROM fresh AS f WHERE f.allowed
    ON CONFLICT (namespace, key) DO NOTHING
    RETURNING 1
)
SELECT true, granted, remaining, retry_us, reset_us, binding, violated, delay_us, now, %[2]s
FROM decided WHERE EXISTS (SELECT FROM updated)
UNION ALL
SELECT true, granted, remaining, retry_us, reset_us, binding, violated, delay_us, now, %[2]s
FROM fresh WHERE EXISTS (SELECT FROM inserted)
UNION ALL
SELECT false, granted, remaining, retry_us, reset_us, binding, violated, delay_us, now, NULL::text
FROM verdict WHERE NOT allowed AND NOT EXISTS (SELECT FROM updated)`

// generalPeekSQL is the decision on the key's row as the snapshot sees it,
// with no lock and no write. Its parameters are generalAllowSQL's but $3.
const generalPeekSQL = `
SELECT d.allowed, d.granted, d.remaining, d.retry_us, d.reset_us, d.binding, d.violated, d.delay_us, c.now, NULL::text
FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now) AS c
LEFT JOIN %[1]s AS t ON t.namespace = $1 AND t.key = $2,
LATERAL %[4]s(t.state, (extract(epoch FROM t.expires_at) * 1000000)::bigint, c.now, $3, $4, $5, $6) AS d`

// Modes of pglimit_decide.
const (
	modeAllow   = 0 // admit n or refuse
	modeAtMost  = 1 // admit up to n
	modeReserve = 2 // admit n within a maximum delay
)

// spec encodes limits for pglimit_decide: algorithm, period (µs), rate and
// burst, four integers per limit.
func spec(limits []Limit) []int64 {
	out := make([]int64, 0, 4*len(limits))
	for _, l := range limits {
		out = append(out, int64(l.Algorithm), l.Period.Microseconds(), int64(l.Rate), int64(l.Burst))
	}
	return out
}

// scanGeneral reads a general statement's answer.
func (b *base) scanGeneral(row pgx.Row, n, mode int) (d Decision, decided bool, err error) {
	var r struct {
		allowed                  bool
		granted, remaining       int64
		retry, reset, delay, now int64
		binding, violated        int32
	}
	err = row.Scan(&r.allowed, &r.granted, &r.remaining, &r.retry, &r.reset, &r.binding, &r.violated, &r.delay, &r.now, nil)
	if err != nil {
		return Decision{}, false, noRowsAsUndecided(err)
	}
	if int(r.binding) >= len(b.cfg.Limits) || r.binding < 0 {
		return Decision{}, false, fmt.Errorf("pglimit_decide returned limit %d of %d: the function does not match this version of pglimit; run Migrate", r.binding, len(b.cfg.Limits))
	}
	d = Decision{
		Allowed:    r.allowed,
		Granted:    int(r.granted),
		Remaining:  int(r.remaining),
		RetryAfter: micros(r.retry),
		ResetAfter: micros(r.reset),
		Delay:      micros(r.delay),
		Limit:      b.cfg.Limits[r.binding],
		violated:   uint16(r.violated),
		policy:     b.policy,
		at:         r.now,
	}
	if !r.allowed && (n == 1 || mode == modeAtMost) && mode != modeReserve {
		d.next = d.RetryAfter // the wait for one unit
	}
	return d, true, nil
}
