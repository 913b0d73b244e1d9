-- insert_messages.sql for writes where a message carries a deadline
-- (expires_at, migration 7). A separate statement, so that writes without one
-- keep working against a table migrated before version 7.
INSERT INTO {{outbox}} (message_id, topic, payload, headers, content_type, correlation_id, partition_key, expires_at)
SELECT coalesce(m.message_id, gen_random_uuid()), m.topic, m.payload, coalesce(m.headers, '{}'),
       m.content_type, m.correlation_id, m.partition_key, m.expires_at
FROM unnest($1::uuid[], $2::text[], $3::bytea[], $4::jsonb[], $5::text[], $6::text[], $7::text[], $8::timestamptz[])
     WITH ORDINALITY AS m(message_id, topic, payload, headers, content_type, correlation_id, partition_key, expires_at, n)
ORDER BY m.n
