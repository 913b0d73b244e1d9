-- Moves dead letters back to the outbox in one statement: each returns as a new
-- row (a new id, so it goes after what is outstanding) with its original
-- message_id, so brokers that de-duplicate still recognise it, and attempts 0.
-- Its created_at is the replay's time: a replay starts the message's clock
-- again, so that the backlog's age (and its alerts) and --max-age count from
-- the operator's decision, not from a write days ago. Its expires_at is kept,
-- except for rows that expired: replaying one means the operator wants it
-- sent. Filters as in dead_letters_list.sql ($1–$5). Returns the dead-letter
-- ids replayed.
WITH moved AS (
    DELETE FROM {{dead_letter}}
    WHERE ($1::bigint[] IS NULL OR id = ANY($1::bigint[]))
      AND ($2::text IS NULL OR topic = $2::text)
      AND ($3::text IS NULL OR reason = $3::text)
      AND ($4::timestamptz IS NULL OR dead_lettered_at >= $4::timestamptz)
      AND ($5::timestamptz IS NULL OR dead_lettered_at < $5::timestamptz)
    RETURNING *
), inserted AS (
    INSERT INTO {{outbox}} (message_id, topic, payload, headers, content_type, correlation_id, partition_key, expires_at)
    SELECT message_id, topic, payload, headers, content_type, correlation_id, partition_key,
           CASE WHEN reason = 'expired' THEN NULL ELSE expires_at END
    FROM moved
    ORDER BY id
)
SELECT id FROM moved ORDER BY id
