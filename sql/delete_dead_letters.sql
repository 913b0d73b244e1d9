-- Deletes up to $2 dead letters older than $1 (an interval), for
-- --dlq-retention. Bounded like delete_dispatched.sql.
WITH doomed AS (
    SELECT id FROM {{dead_letter}}
    WHERE dead_lettered_at < now() - $1::interval
    ORDER BY dead_lettered_at
    LIMIT $2
)
DELETE FROM {{dead_letter}} d
USING doomed
WHERE d.id = doomed.id
