-- insert_messages_json.sql for writes where a message carries a deadline
-- (expires_at, migration 7). A separate statement, so that writes without one
-- keep working against a table migrated before version 7.
INSERT INTO {{outbox}} (message_id, topic, payload, headers, content_type, correlation_id, partition_key, expires_at)
SELECT coalesce((m.doc->>'message_id')::uuid, gen_random_uuid()), m.doc->>'topic',
       decode(m.doc->>'payload', 'base64'), coalesce(m.doc->'headers', '{}'),
       m.doc->>'content_type', m.doc->>'correlation_id', m.doc->>'partition_key',
       (m.doc->>'expires_at')::timestamptz
FROM jsonb_array_elements($1::text::jsonb) WITH ORDINALITY AS m(doc, n)
ORDER BY m.n
