-- Each topic's outstanding rows and the age of its oldest, for the admin API's
-- GET /status. The inner query is an index-only scan of the (topic, id) index
-- of outstanding rows, grouped in the index's order: it reads one index entry
-- per outstanding row, so its cost grows with the backlog (BENCHMARKS.md has
-- it at 1,000 topics and 1,000,000 rows); the heap is read once per topic, for
-- the created_at of its lowest id.
SELECT b.topic, b.outstanding, extract(epoch FROM now() - o.created_at)::float8
FROM (SELECT topic, count(*) AS outstanding, min(id) AS oldest
      FROM {{outbox}}
      WHERE dispatched_at IS NULL
      GROUP BY topic) AS b
JOIN {{outbox}} AS o ON o.id = b.oldest
ORDER BY b.topic
