-- pause holds a key of a single GCRA limit back until $3 µs from now, on
-- the database's clock, and lets it resume at the limit's rate: its TAT
-- becomes at least now + $3 (the pause, plus the burst's span less one
-- emission interval, which the caller adds), so that the first unit fits
-- when the pause ends and the burst refills from there. A pause never
-- shortens one in force. $1 namespace, $2 key, $3 µs. Placeholder: table.
{{define "pause"}}
INSERT INTO {{.table}} AS t (namespace, key, expires_at)
VALUES ($1, $2, clock_timestamp() + $3::bigint * interval '1 microsecond')
ON CONFLICT (namespace, key) DO UPDATE SET expires_at = greatest(t.expires_at, excluded.expires_at)
{{end}}
