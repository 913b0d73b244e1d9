-- The gauges that need a query, read on a schedule: outstanding rows (an
-- index-only count of the partial index), the age of the oldest outstanding row
-- (the lowest id's, through the same index; 0 when its created_at is
-- infinite, which has no age, as in backlog_by_topic.sql), and dead letters.
SELECT (SELECT count(*) FROM {{outbox}} WHERE dispatched_at IS NULL),
       coalesce((SELECT CASE WHEN isfinite(created_at) THEN extract(epoch FROM now() - created_at)::float8 ELSE 0 END
                 FROM {{outbox}} WHERE dispatched_at IS NULL ORDER BY id LIMIT 1), 0),
       (SELECT count(*) FROM {{dead_letter}})
