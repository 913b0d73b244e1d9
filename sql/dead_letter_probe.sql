-- The probe's look at the dead-letter table: how many rows, and the newest ones
-- dead-lettered after $1 (their correlation ids and reasons only, never a
-- payload), at most $2 of them.
SELECT (SELECT count(*) FROM {{dead_letter}}) AS total,
       d.id, d.correlation_id, d.reason, d.dead_lettered_at
FROM (SELECT 1) one
LEFT JOIN LATERAL (
    SELECT id, correlation_id, reason, dead_lettered_at
    FROM {{dead_letter}}
    WHERE dead_lettered_at > $1
    ORDER BY dead_lettered_at DESC, id DESC
    LIMIT $2
) d ON true
