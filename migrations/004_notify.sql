-- Wakes sweepers when rows are committed, so delivery takes milliseconds rather
-- than up to a tick. The trigger is per statement, so an insert of 1,000 rows
-- sends one notification, and Postgres folds identical notifications of one
-- transaction into one, delivered at its commit (never for a rollback). The
-- payload names the table, so sweepers of other outboxes in this database
-- ignore it.
--
-- Cost to the application: a transaction that notifies takes a database-wide
-- lock for a moment at commit, so commits that insert into the outbox are
-- serialized there. A sweeper run with --notify=false still polls; drop the
-- trigger too if writes must not pay it.
CREATE FUNCTION {{.schema}}.{{.prefix}}_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_sweeper', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    RETURN NULL;
END
$$;

CREATE TRIGGER {{.prefix}}_notify AFTER INSERT ON {{.outbox}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.{{.prefix}}_notify();

---- create above / drop below ----

DROP TRIGGER {{.prefix}}_notify ON {{.outbox}};
DROP FUNCTION {{.schema}}.{{.prefix}}_notify();
