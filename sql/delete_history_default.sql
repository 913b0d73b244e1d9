-- Deletes up to $2 rows older than $1 (an interval) from the history table's
-- DEFAULT partition, the safety net for moves that found no partition (docs/concepts.md,
-- "Retention"). It is normally empty, so a row DELETE is the cheap way to empty
-- it; the partitions proper are dropped whole. Read whole (no index).
WITH doomed AS (
    SELECT ctid FROM {{history_default}}
    WHERE dispatched_at < now() - $1::interval
    LIMIT $2
)
DELETE FROM {{history_default}}
WHERE ctid = ANY (ARRAY(SELECT ctid FROM doomed))
