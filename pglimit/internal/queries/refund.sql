-- The refund statements give back units of an admission, each limit only
-- while the admission still weighs on it as it left it, and only if the
-- write that took them committed (refund.made): a decision in a caller's
-- transaction that rolled back took nothing, and the key's row cannot
-- tell, since a later admission may leave it as that decision had. They
-- answer one row: how the decision's transaction ended, and which limits
-- took the units back (NULL when none was asked to: not committed, or the
-- key's row is gone or changed shape).

-- refund.made is how the decision's write ended, by the id of the
-- transaction that made it (its argument names the parameter: the id as
-- setting.xact returned it, or NULL for a decision in its own transaction,
-- which committed before it was returned): 'committed', 'aborted', 'in
-- progress' (that transaction is still open), or NULL when the id is too
-- old for the server to know. It is computed once, before the key's row
-- is touched, so that a refund never waits for an open transaction's lock
-- on the row.
{{define "refund.made"}}CASE WHEN {{.}}::text IS NULL THEN 'committed' ELSE pg_xact_status({{.}}::text::xid8) END{{end}}

-- refund.single gives back $4 µs of a single GCRA limit's TAT, if the
-- TAT is still $3, the one the admission left: then nothing was admitted
-- after it, or everything admitted after it was given back, and the key
-- is exactly as if the refunded units had never been asked for. $5 is the
-- decision's transaction (refund.made).
{{define "refund.single"}}
WITH made AS (
    SELECT {{template "refund.made" "$5"}} AS status
){{template "refund.single_tail" .}}
{{end}}

-- refund.single_tail ends refund.single and refund.single_id, after made.
{{define "refund.single_tail"}}, changed AS (
    UPDATE {{.table}} SET expires_at = expires_at - $4 * interval '1 microsecond'
    WHERE namespace = $1 AND key = $2 AND expires_at = timestamptz 'epoch' + $3 * interval '1 microsecond'
      AND (SELECT status FROM made) = 'committed'
    RETURNING 1
)
SELECT m.status, CASE WHEN EXISTS (SELECT FROM changed) THEN ARRAY[true] END FROM made AS m
{{end}}

-- refund.general gives back $4 units of each limit the admission still
-- weighs on, by the anchors $3 (one per limit) and, for GCRA, the
-- emission intervals $5: a GCRA limit whose TAT is still its anchor, a
-- fixed window still the one it counted in, a sliding window's current
-- or previous window. $6 is the decision's transaction (refund.made).
-- Placeholders: table; new_state and flags, which arith.RefundSQL writes;
-- state_length, the state's length; limits, the number of limits.
{{define "refund.general"}}
WITH made AS (
    SELECT {{template "refund.made" "$6"}} AS status
){{template "refund.general_tail" .}}
{{end}}

-- refund.general_tail ends refund.general and refund.general_id, after
-- made.
{{define "refund.general_tail"}}, old AS (
    SELECT t.state FROM {{.table}} AS t
    WHERE t.namespace = $1 AND t.key = $2 AND cardinality(t.state) = {{.state_length}}
      AND cardinality($5::bigint[]) = {{.limits}} AND (SELECT status FROM made) = 'committed'
    FOR UPDATE
), changed AS (
    UPDATE {{.table}} AS t SET state = {{.new_state}} FROM old
    WHERE t.namespace = $1 AND t.key = $2
    RETURNING 1
)
SELECT m.status, (SELECT {{.flags}} FROM old WHERE EXISTS (SELECT FROM changed)) FROM made AS m
{{end}}

-- refund.single_id and refund.general_id refund by decision id (RefundID):
-- made marks the id's row refunded, and only a row not yet settled nor
-- refunded; a row that it marks was written with its admission, so that
-- admission committed. Two refunds of one id race on the row's lock: the
-- second, once the first commits, marks nothing, and the statement
-- answers no row. The rest is refund.single's and refund.general's, with
-- the id in place of the transaction ($5 and $6). Placeholders: theirs,
-- and ids.
{{define "refund.single_id"}}
WITH made AS (
    UPDATE {{.ids}} SET done = 'refunded' WHERE namespace = $1 AND id = $5 AND done IS NULL
    RETURNING 'committed'::text AS status
){{template "refund.single_tail" .}}
{{end}}

{{define "refund.general_id"}}
WITH made AS (
    UPDATE {{.ids}} SET done = 'refunded' WHERE namespace = $1 AND id = $6 AND done IS NULL
    RETURNING 'committed'::text AS status
){{template "refund.general_tail" .}}
{{end}}
