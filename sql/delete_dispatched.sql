-- Deletes up to $2 dispatched rows older than $1 (an interval), oldest first.
-- Served by the partial index on dispatched_at; outstanding rows never match.
-- Bounded, so each run holds its locks briefly; the cleaner repeats it until a
-- run deletes fewer than $2.
WITH doomed AS (
    SELECT id FROM {{outbox}}
    WHERE dispatched_at < now() - $1::interval
    ORDER BY dispatched_at
    LIMIT $2
)
DELETE FROM {{outbox}} o
USING doomed
WHERE o.id = doomed.id
