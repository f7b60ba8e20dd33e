-- The elected leader's session (the Cleaner's, and Range's cleanup job):
-- it holds advisory.try_lock's lock, and leadership.session makes the
-- server end it when the leader goes quiet ($1 idle_session_timeout) or its
-- client goes away ($2 client_connection_check_interval), releasing the
-- lock.
{{define "leadership.session"}}
SELECT set_config('idle_session_timeout', $1, false),
       set_config('client_connection_check_interval', $2, false)
{{end}}
