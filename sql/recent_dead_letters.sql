-- Counts a topic's rows dead-lettered within the last $2 (an interval), for the
-- storm guard. Served by the (topic, dead_lettered_at) index.
SELECT count(*)
FROM {{dead_letter}}
WHERE topic = $1
  AND dead_lettered_at > now() - $2::interval
