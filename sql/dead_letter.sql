-- Moves rows to the dead-letter table, in the transaction that claimed them: one
-- statement deletes them from the outbox and inserts them, every column kept,
-- with the reason and the error. A row is in exactly one table at every moment,
-- whatever happens to the process. Only rows with at least $2 attempts move ($2
-- is 0 for rows a message-class error named, --max-attempts otherwise). Returns
-- the moved rows' correlation ids, for the log.
WITH moved AS (
    DELETE FROM {{outbox}}
    WHERE id = ANY($1::bigint[])
      AND attempts >= $2
    RETURNING *
)
INSERT INTO {{dead_letter}} (id, message_id, topic, payload, headers, content_type, correlation_id,
                             partition_key, created_at, expires_at, dispatched_at, attempts, last_error, reason,
                             error, dead_lettered_at)
SELECT id, message_id, topic, payload, headers, content_type, correlation_id,
       partition_key, created_at, expires_at, NULL, attempts, last_error, $3, $4, clock_timestamp()
FROM moved
RETURNING correlation_id
