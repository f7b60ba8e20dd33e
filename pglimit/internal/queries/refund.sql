-- refund.single gives back $4 µs of a single GCRA limit's TAT, if the
-- TAT is still $3, the one the admission left: then nothing was admitted
-- after it, or everything admitted after it was given back, and the key
-- is exactly as if the refunded units had never been asked for.
{{define "refund.single"}}
UPDATE {{.table}} SET expires_at = expires_at - $4 * interval '1 microsecond'
WHERE namespace = $1 AND key = $2 AND expires_at = timestamptz 'epoch' + $3 * interval '1 microsecond'
RETURNING ARRAY[true]
{{end}}

-- refund.general gives back $4 units of each limit the admission still
-- weighs on, by the anchors $3 (one per limit) and, for GCRA, the
-- emission intervals $5: a GCRA limit whose TAT is still its anchor, a
-- fixed window still the one it counted in, a sliding window's current
-- or previous window. It returns which limits took the units back. Placeholders:
-- table; new_state and flags, which arith.RefundSQL writes;
-- state_length, the state's length; limits, the number of limits.
{{define "refund.general"}}
WITH old AS (
    SELECT t.state FROM {{.table}} AS t
    WHERE t.namespace = $1 AND t.key = $2 AND cardinality(t.state) = {{.state_length}}
      AND cardinality($5::bigint[]) = {{.limits}}
    FOR UPDATE
), changed AS (
    UPDATE {{.table}} AS t SET state = {{.new_state}} FROM old
    WHERE t.namespace = $1 AND t.key = $2
    RETURNING 1
)
SELECT {{.flags}} FROM old WHERE EXISTS (SELECT FROM changed)
{{end}}
