-- The trigger of migration 4 notified on every commit, and a commit that
-- notifies takes a lock that is cluster-wide and holds it until its commit
-- record is on disk: such commits queue behind one another, one disk flush
-- each, instead of sharing flushes. At 1,000 single-row commits a second on a
-- disk that flushes in half a millisecond that queue is nearly always busy, and
-- it tips over: on the project's benchmark machine the application's commits
-- went from about 2 ms to over a second (BENCHMARKS.md, "Wake-up without the commit queue").
--
-- A notification is only needed when no sweeper is already sweeping. A sweeper
-- that finds rows stays awake, sweeping again at once, and holds the advisory
-- lock below while it does (outbox/awake.go); the trigger notifies only when it
-- can take that lock in shared mode, that is, when no sweeper holds it. Under a
-- steady stream of commits the application's commits notify nothing and take
-- no cluster-wide lock; after a quiet spell the first commit wakes a sweeper as
-- before.
--
-- The shared lock is taken and given back at once, rather than held to the end
-- of the transaction, so that an application's open transactions never keep a
-- sweeper from taking the lock.
--
-- A commit that did not notify is still swept: when a sweeper lets the lock go
-- it keeps sweeping until every transaction that was running at that moment has
-- ended, so a row whose statement saw the lock held is either committed and
-- swept, or rolled back.
--
-- The key is fixed per table, so the sweepers of one outbox share it and those
-- of other outboxes in the database do not.
CREATE OR REPLACE FUNCTION {{.schema}}.{{.prefix}}_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_try_advisory_lock_shared({{.awake_key}}) THEN
        PERFORM pg_advisory_unlock_shared({{.awake_key}});
        PERFORM pg_notify('outbox_sweeper', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    END IF;
    RETURN NULL;
END
$$;

---- create above / drop below ----

CREATE OR REPLACE FUNCTION {{.schema}}.{{.prefix}}_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_sweeper', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    RETURN NULL;
END
$$;
