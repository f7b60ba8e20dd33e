-- What a decision does to the transaction it runs in.
--
-- setting.async and setting.none are the value of the extra column in a
-- statement's admitting branches: setting.async sets synchronous_commit
-- off for the statement's own implicit transaction (Config.AsyncCommit). A
-- set_config is evaluated only when a row is admitted, which is the only
-- time the statement writes.
{{define "setting.async"}}set_config('synchronous_commit', 'off', true){{end}}
{{define "setting.none"}}NULL::text{{end}}

-- setting.xact is the extra column of a decision in a caller's
-- transaction: the id (xid8, as text) of the subtransaction that wrote the
-- key's row, the decision's savepoint, by which a refund learns whether
-- the write committed (refund.made). Not the caller's top transaction's
-- id: a rollback to a savepoint of the caller's around the decision undoes
-- the write in a transaction that still commits. The row version's xmin
-- is that subtransaction's 32-bit id; its epoch is the top transaction's
-- (pg_current_xact_id), whose id precedes it by less than 2^32. It reads
-- the xmin that the writes return with returning.xact, which the
-- statement's updated and inserted CTEs must then carry.
{{define "setting.xact"}}{{template "xact.of" "(SELECT xmin FROM updated UNION ALL SELECT xmin FROM inserted)"}}{{end}}
{{define "returning.xact"}}, xmin{{end}}

-- setting.xact_written is setting.xact for key_row.allow, whose one write
-- is written; xact.of is their expression, given the writes' xmins.
{{define "setting.xact_written"}}{{template "xact.of" "written"}}{{end}}
{{define "xact.of"}}(SELECT (top.id + (w.xmin::text::bigint - top.id % 4294967296 + 4294967296) % 4294967296)::text
    FROM {{.}} AS w,
        (SELECT pg_current_xact_id()::text::bigint AS id) AS top){{end}}

-- The savepoint around a statement run in a caller's transaction (AllowTx,
-- Semaphore.AcquireTx). The caller's lock_timeout and statement_timeout are
-- kept in placeholder settings and restored; a rollback to the savepoint
-- restores them too. $1 of savepoint.set_lock_timeout is the decision's
-- own bound, for both unless the caller's is shorter: lock_timeout alone
-- bounds each lock wait, and a statement queued behind another waiter
-- waits twice (for the tuple, then for the holder's transaction).
{{define "savepoint"}}SAVEPOINT pglimit_decision{{end}}
{{define "savepoint.set_lock_timeout"}}
SELECT set_config('pglimit.saved_lock_timeout', current_setting('lock_timeout'), true),
       set_config('pglimit.saved_statement_timeout', current_setting('statement_timeout'), true),
       set_config('lock_timeout', {{template "savepoint.shorter" "lock_timeout"}}, true),
       set_config('statement_timeout', {{template "savepoint.shorter" "statement_timeout"}}, true)
{{end}}
{{define "savepoint.shorter"}}CASE WHEN current_setting('{{.}}') <> '0' AND current_setting('{{.}}')::interval < $1::text::interval
           THEN current_setting('{{.}}') ELSE $1::text END{{end}}
{{define "savepoint.restore_lock_timeout"}}SELECT set_config('lock_timeout', current_setting('pglimit.saved_lock_timeout'), true),
       set_config('statement_timeout', current_setting('pglimit.saved_statement_timeout'), true){{end}}
{{define "savepoint.release"}}RELEASE SAVEPOINT pglimit_decision{{end}}
{{define "savepoint.rollback"}}ROLLBACK TO SAVEPOINT pglimit_decision; RELEASE SAVEPOINT pglimit_decision{{end}}
