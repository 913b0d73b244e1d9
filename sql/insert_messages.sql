-- Inserts many messages in one statement, so one round trip, from parallel
-- arrays. Rows keep the arrays' order, so their ids ascend in it.
INSERT INTO {{outbox}} (message_id, topic, payload, headers, content_type, correlation_id, partition_key)
SELECT coalesce(m.message_id, gen_random_uuid()), m.topic, m.payload, coalesce(m.headers, '{}'),
       m.content_type, m.correlation_id, m.partition_key
FROM unnest($1::uuid[], $2::text[], $3::bytea[], $4::jsonb[], $5::text[], $6::text[], $7::text[])
     WITH ORDINALITY AS m(message_id, topic, payload, headers, content_type, correlation_id, partition_key, n)
ORDER BY m.n
