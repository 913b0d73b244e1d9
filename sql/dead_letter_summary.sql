-- Dead letters by topic and reason: how many, and the age of the oldest, for
-- the admin API's GET /status. A scan of the dead-letter table, which holds
-- what failed and was not yet replayed or purged: small next to the outbox.
SELECT topic, reason, count(*), extract(epoch FROM now() - min(dead_lettered_at))::float8
FROM {{dead_letter}}
GROUP BY topic, reason
ORDER BY topic, reason
