-- The probe's look at the dead-letter table: how many rows in all, how many
-- dead-lettered after $1 (the last alert's newest row), and the newest of
-- those, at most $2 (their correlation ids and reasons only, never a payload).
SELECT (SELECT count(*) FROM {{dead_letter}}) AS total,
       (SELECT count(*) FROM {{dead_letter}} WHERE dead_lettered_at > $1) AS fresh,
       d.id, d.correlation_id, d.reason, d.dead_lettered_at
FROM (SELECT 1) one
LEFT JOIN LATERAL (
    SELECT id, correlation_id, reason, dead_lettered_at
    FROM {{dead_letter}}
    WHERE dead_lettered_at > $1
    ORDER BY dead_lettered_at DESC, id DESC
    LIMIT $2
) d ON true
