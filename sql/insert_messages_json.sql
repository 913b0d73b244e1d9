-- Inserts messages given as one JSON array, for database/sql: a single text
-- parameter every driver passes as it is, where arrays would need the
-- driver's own types. One statement, so one round trip; rows keep the
-- array's order, so their ids ascend in it. The payload travels as base64.
INSERT INTO {{outbox}} (message_id, topic, payload, headers, content_type, correlation_id, partition_key)
SELECT coalesce((m.doc->>'message_id')::uuid, gen_random_uuid()), m.doc->>'topic',
       decode(m.doc->>'payload', 'base64'), coalesce(m.doc->'headers', '{}'),
       m.doc->>'content_type', m.doc->>'correlation_id', m.doc->>'partition_key'
FROM jsonb_array_elements($1::text::jsonb) WITH ORDINALITY AS m(doc, n)
ORDER BY m.n
