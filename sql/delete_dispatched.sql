-- Deletes up to $2 dispatched rows older than $1 (an interval) from the outbox,
-- oldest first,
-- from $3 on, and returns how many it deleted and the newest dispatched_at
-- among them. Served by the partial index on dispatched_at; outstanding rows
-- never match. Bounded, so each run holds its locks briefly; the cleaner
-- repeats it until a run deletes fewer than $2.
--
-- $3 is where the last run stopped, less a margin (outbox/maintenance.go):
-- a deleted row's entry stays in the index until vacuum removes it, and while
-- something holds the vacuum horizon (a report, pg_dump, a replica) that is
-- never, so a delete that started from the oldest entry every run would walk
-- every row deleted since the hold began, and slow with each run.
--
-- Since the history table (migration 10) the sweeper no longer marks rows in
-- the outbox: it moves them. The rows this deletes are those marked before the
-- upgrade (or by sweepers of the previous version during a rolling upgrade),
-- and they are gone one retention period after it; the statement then finds
-- nothing, through an index that holds nothing. The history itself is retired
-- by dropping partitions (outbox/partitions.go).
WITH doomed AS (
    SELECT id FROM {{outbox}}
    WHERE dispatched_at >= $3::timestamptz
      AND dispatched_at < now() - $1::interval
    ORDER BY dispatched_at
    LIMIT $2
), gone AS (
    DELETE FROM {{outbox}} o
    USING doomed
    WHERE o.id = doomed.id
    RETURNING o.dispatched_at
)
SELECT count(*), max(dispatched_at) FROM gone
