-- Inserts one message. NULL message_id takes the column's default.
INSERT INTO {{outbox}} (message_id, topic, payload, headers, content_type, correlation_id, partition_key)
VALUES (coalesce($1::uuid, gen_random_uuid()), $2, $3, coalesce($4::jsonb, '{}'), $5, $6, $7)
