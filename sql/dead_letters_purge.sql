-- Deletes dead letters for good. Filters as in dead_letters_list.sql ($1–$5).
-- With $6 (dry run) it deletes nothing and counts what it would.
WITH doomed AS (
    SELECT id FROM {{dead_letter}}
    WHERE ($1::bigint[] IS NULL OR id = ANY($1::bigint[]))
      AND ($2::text IS NULL OR topic = $2::text)
      AND ($3::text IS NULL OR reason = $3::text)
      AND ($4::timestamptz IS NULL OR dead_lettered_at >= $4::timestamptz)
      AND ($5::timestamptz IS NULL OR dead_lettered_at < $5::timestamptz)
), deleted AS (
    DELETE FROM {{dead_letter}} d USING doomed
    WHERE d.id = doomed.id AND NOT $6::bool
    RETURNING d.id
)
SELECT count(*) FROM doomed
