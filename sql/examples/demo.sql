-- Demo messages for `make run`: three topics, one with headers and a correlation id.
INSERT INTO outbox (topic, payload) VALUES
    ('orders.created', convert_to('{"order_id":1,"total":"12.50"}', 'UTF8')),
    ('orders.created', convert_to('{"order_id":2,"total":"7.00"}', 'UTF8')),
    ('invoices.issued', convert_to('{"invoice_id":"INV-1","order_id":1}', 'UTF8'));
INSERT INTO outbox (topic, payload, headers, content_type, correlation_id)
VALUES ('emails.requested', convert_to('{"to":"ops@example.com","template":"welcome"}', 'UTF8'),
        '{"tenant":"acme"}', 'application/json', 'req-demo-1');
