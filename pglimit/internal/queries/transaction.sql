-- What a decision does to the transaction it runs in.
--
-- setting.async and setting.none are the value of the extra column in a
-- statement's admitting branches: setting.async sets synchronous_commit
-- off for the statement's own implicit transaction (Config.AsyncCommit). A
-- set_config is evaluated only when a row is admitted, which is the only
-- time the statement writes.
{{define "setting.async"}}set_config('synchronous_commit', 'off', true){{end}}
{{define "setting.none"}}NULL::text{{end}}

-- The savepoint around a statement run in a caller's transaction (AllowTx,
-- Semaphore.AcquireTx). The caller's lock_timeout is kept in a placeholder
-- setting and restored; a rollback to the savepoint restores it too. $1 of
-- savepoint.set_lock_timeout is the decision's own lock_timeout.
{{define "savepoint"}}SAVEPOINT pglimit_decision{{end}}
{{define "savepoint.set_lock_timeout"}}
SELECT set_config('pglimit.saved_lock_timeout', current_setting('lock_timeout'), true),
       set_config('lock_timeout', $1, true)
{{end}}
{{define "savepoint.restore_lock_timeout"}}SELECT set_config('lock_timeout', current_setting('pglimit.saved_lock_timeout'), true){{end}}
{{define "savepoint.release"}}RELEASE SAVEPOINT pglimit_decision{{end}}
{{define "savepoint.rollback"}}ROLLBACK TO SAVEPOINT pglimit_decision; RELEASE SAVEPOINT pglimit_decision{{end}}
