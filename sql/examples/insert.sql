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

-- Concurrent transactions writing one topic commit in any order, and ids are
-- drawn at insert: a lower id can commit after a higher one was sent. For
-- commit order per topic, lock the topic before inserting (Go's
-- Writer.WriteOrdered does the same); a second writer of the topic then waits
-- for this transaction to end. The string is 'outbox-writer <schema>.<table> <topic>'.
BEGIN;
SELECT pg_advisory_xact_lock(hashtextextended('outbox-writer public.outbox orders.paid', 0));
INSERT INTO outbox (topic, payload)
VALUES ('orders.paid', convert_to('{"order_id":43}', 'UTF8'));
COMMIT;

-- Is anything stuck? Outstanding rows, oldest first, with their failures:
-- SELECT id, topic, attempts, last_error, created_at
-- FROM outbox WHERE dispatched_at IS NULL ORDER BY id LIMIT 20;
