-- table.columns: whether table $1 exists, and its columns, one a line,
-- each as its name and type ("expires_at timestamp with time zone"), which
-- a limiter checks against its strategy's shape before its first
-- decision. Text, not an array: a database/sql transaction (AllowTx)
-- scans it too.
{{define "table.columns"}}
SELECT c.oid IS NOT NULL,
       coalesce((SELECT string_agg(a.attname::text || ' ' || pg_catalog.format_type(a.atttypid, NULL), E'\n' ORDER BY a.attnum)
                 FROM pg_catalog.pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '')
FROM (SELECT pg_catalog.to_regclass($1) AS oid) c
{{end}}
