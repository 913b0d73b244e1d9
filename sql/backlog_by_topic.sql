-- Each topic's outstanding rows and the age of its oldest, for the admin API's
-- GET /status. The inner query is an index-only scan of the (topic, id) index
-- of outstanding rows, grouped in the index's order: it reads one index entry
-- per outstanding row, so its cost grows with the backlog (BENCHMARKS.md has
-- it at 1,000 topics and 1,000,000 rows); the heap is read once per topic, for
-- the created_at of its lowest id. A created_at of 'infinity' or '-infinity'
-- (migration 8 refuses new ones; the sweeper dead-letters those it finds as
-- unreadable_row) has no age: it counts as 0, where now() - created_at would
-- fail the whole answer.
SELECT b.topic, b.outstanding,
       CASE WHEN isfinite(o.created_at) THEN extract(epoch FROM now() - o.created_at)::float8 ELSE 0 END
FROM (SELECT topic, count(*) AS outstanding, min(id) AS oldest
      FROM {{outbox}}
      WHERE dispatched_at IS NULL
      GROUP BY topic) AS b
JOIN {{outbox}} AS o ON o.id = b.oldest
ORDER BY b.topic
