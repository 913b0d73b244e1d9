-- Writing outbox rows from an application in any language: insert in the same
-- transaction as the business change, so the message exists if and only if the
-- change committed. Only topic and payload are required.

BEGIN;

UPDATE orders SET status = 'paid' WHERE id = 42;  -- the business change

INSERT INTO outbox (topic, payload)
VALUES ('orders.paid', convert_to('{"order_id":42}', 'UTF8'));

-- With every optional column: message_id is the idempotency key the broker sees
-- (generate it yourself to know it in advance), headers become application
-- properties, partition_key becomes the session id / message key.
INSERT INTO outbox (topic, payload, message_id, headers, content_type, correlation_id, partition_key)
VALUES ('orders.paid',
        convert_to('{"order_id":42}', 'UTF8'),
        '6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22',
        '{"tenant":"acme","schema_version":2}',
        'application/json',
        'req-7f3a',
        'order-42');

COMMIT;

-- Is anything stuck? Outstanding rows, oldest first, with their failures:
-- SELECT id, topic, attempts, last_error, created_at
-- FROM outbox WHERE dispatched_at IS NULL ORDER BY id LIMIT 20;
