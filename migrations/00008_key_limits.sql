-- Limits per key, changed at runtime (pglimit.Config.Overrides): a row
-- gives a key of a namespace its own rate and burst for some of the
-- limiter's limits, by name, such as
--   INSERT INTO pglimit_overrides (namespace, key, limits)
--   VALUES ('api', 'customer-7', '{"per-minute": {"rate": 100, "burst": 20}}');
-- Limits and fields it does not name keep the limiter's. The next decision
-- on the key, on every instance, reads it: nothing caches it.
--
-- pglimit_valid_overrides keeps out what a decision could not use: a rate
-- or burst that is not a whole number from 1 to 2^30, or another field.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION pglimit_valid_overrides(limits jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_typeof(limits) = 'object' AND NOT EXISTS (
        SELECT FROM jsonb_each(limits) AS l(name, v)
        WHERE jsonb_typeof(v) IS DISTINCT FROM 'object'
           OR EXISTS (SELECT FROM jsonb_each(v) AS f(field, n)
                      WHERE CASE WHEN f.field NOT IN ('rate', 'burst') OR jsonb_typeof(f.n) <> 'number' THEN true
                                 ELSE (f.n)::numeric NOT BETWEEN 1 AND 1073741824
                                   OR (f.n)::numeric <> trunc((f.n)::numeric)
                            END))
$$;
-- +goose StatementEnd

CREATE TABLE pglimit_overrides (
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    limits     jsonb       NOT NULL CHECK (pglimit_valid_overrides(limits)),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, key)
);

-- +goose Down
DROP TABLE pglimit_overrides;
DROP FUNCTION pglimit_valid_overrides(jsonb);
