-- Dead letters by reason, with the age of each reason's oldest, for the
-- gauges read on a schedule. It reads the whole dead-letter table: small
-- while operators replay and purge (and --dlq-retention bounds it).
SELECT reason, count(*), extract(epoch FROM now() - min(dead_lettered_at))::float8
FROM {{dead_letter}}
GROUP BY reason
ORDER BY reason
