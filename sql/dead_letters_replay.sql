-- Moves dead letters back to the outbox in one statement: each returns as a new
-- row (a new id, so it goes after what is outstanding) with its original
-- message_id, so brokers that de-duplicate still recognise it, attempts 0 and
-- its original created_at. Filters as in dead_letters_list.sql ($1–$5). Returns
-- the dead-letter ids replayed.
WITH moved AS (
    DELETE FROM {{dead_letter}}
    WHERE ($1::bigint[] IS NULL OR id = ANY($1::bigint[]))
      AND ($2::text IS NULL OR topic = $2::text)
      AND ($3::text IS NULL OR reason = $3::text)
      AND ($4::timestamptz IS NULL OR dead_lettered_at >= $4::timestamptz)
      AND ($5::timestamptz IS NULL OR dead_lettered_at < $5::timestamptz)
    RETURNING *
), inserted AS (
    INSERT INTO {{outbox}} (message_id, topic, payload, headers, content_type, correlation_id, partition_key, created_at)
    SELECT message_id, topic, payload, headers, content_type, correlation_id, partition_key, created_at
    FROM moved
    ORDER BY id
)
SELECT id FROM moved ORDER BY id
