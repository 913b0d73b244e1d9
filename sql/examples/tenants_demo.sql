-- Demo messages for `make run-tenants`: the same topic in every tenant, which
-- --destination '{schema}.{topic}' sends under each tenant's name.
INSERT INTO demo_tenant_acme.outbox (topic, payload) VALUES ('orders.created', convert_to('{"order_id":1}', 'UTF8'));
INSERT INTO demo_tenant_globex.outbox (topic, payload) VALUES ('orders.created', convert_to('{"order_id":1}', 'UTF8'));
INSERT INTO demo_tenant_initech.outbox (topic, payload) VALUES ('orders.created', convert_to('{"order_id":1}', 'UTF8'));
