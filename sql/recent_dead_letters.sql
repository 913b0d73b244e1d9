-- Counts a topic's rows dead-lettered within the last $2 (an interval), for the
-- storm guard. Served by the partial (topic, dead_lettered_at) index of
-- migration 7, which leaves expired rows out. Expired rows do not count: a broker outage longer than --max-age expires a topic's backlog
-- at once, by design, and that is no sign of a producer misreading errors.
SELECT count(*)
FROM {{dead_letter}}
WHERE topic = $1
  AND dead_lettered_at > now() - $2::interval
  AND reason <> 'expired'
