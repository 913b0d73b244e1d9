-- Wakes sweepers when rows are committed, so delivery takes milliseconds rather
-- than up to a tick. The trigger is per statement, so an insert of 1,000 rows
-- sends one notification, and Postgres folds identical notifications of one
-- transaction into one, delivered at its commit (never for a rollback). The
-- payload names the table, so sweepers of other outboxes in this database
-- ignore it.
--
-- Cost to the application: at commit, a transaction that notified takes a lock
-- that is cluster-wide and holds it until its commit record is flushed (and,
-- with synchronous replication, acknowledged), so such commits are serialized
-- at the disk's flush latency. A sweeper run with --notify=false still polls;
-- drop this trigger too if writes must not pay for it (README, "Wake-up on
-- commit").
--
-- Creating the trigger locks the outbox against writes until running batch
-- transactions end. Wait at most 10s for that, then fail (nothing changes, and
-- migrate can be run again) rather than holding the application's inserts
-- behind a long wait.
SET LOCAL lock_timeout = '10s';

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
