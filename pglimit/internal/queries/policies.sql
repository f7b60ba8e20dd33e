-- policies.*: each limiter's policy (migration 00011), which a limiter
-- records at its first decision and the operator command reads.

-- policies.can_record: whether table $1 (pglimit_policies, schema-
-- qualified) exists and the server can write. A catalog read, which never
-- fails for a missing table: a schema migrated before 00011 is told apart
-- without a failed statement.
{{define "policies.can_record"}}
SELECT pg_catalog.to_regclass($1) IS NOT NULL AND NOT pg_catalog.pg_is_in_recovery()
{{end}}

-- policies.record: the policy $3 of table $1's namespace $2. A policy that
-- differs from the one recorded moves that one to previous; the same
-- policy recorded again within a minute writes nothing (a fleet that
-- starts at once takes the row's lock, briefly, and writes one version).
{{define "policies.record"}}
INSERT INTO {{.policies}} AS p (table_name, namespace, policy)
VALUES ($1, $2, $3)
ON CONFLICT (table_name, namespace) DO UPDATE
SET policy = excluded.policy,
    recorded_at = now(),
    previous = CASE WHEN p.policy = excluded.policy THEN p.previous ELSE p.policy END,
    previous_recorded_at = CASE WHEN p.policy = excluded.policy THEN p.previous_recorded_at ELSE p.recorded_at END
WHERE p.policy <> excluded.policy OR p.recorded_at < now() - interval '1 minute'
{{end}}

-- policies.list: every recorded policy of the schema, as one jsonb array,
-- each row's latest then its previous; bounded by the number of namespaces.
{{define "policies.list"}}
SELECT coalesce(jsonb_agg(jsonb_build_object(
           'table', table_name, 'namespace', namespace,
           'policy', policy, 'recorded_at', recorded_at,
           'previous', previous, 'previous_recorded_at', previous_recorded_at)
         ORDER BY table_name, namespace), '[]'::jsonb)
FROM {{.policies}}
{{end}}
