-- Demo tenants for `make run-tenants`: three tenant schemas, made before
-- `sweeper migrate --schemas 'demo_tenant_*'` gives each its outbox. Run again,
-- it leaves the schemas as they are.
CREATE SCHEMA IF NOT EXISTS demo_tenant_acme;
CREATE SCHEMA IF NOT EXISTS demo_tenant_globex;
CREATE SCHEMA IF NOT EXISTS demo_tenant_initech;
