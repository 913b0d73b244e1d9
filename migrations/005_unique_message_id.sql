-- message_id is the idempotency key the broker sees, so no two rows of the outbox
-- may share one. Brokers that de-duplicate (NATS JetStream's Nats-Msg-Id window,
-- Service Bus duplicate detection, a RabbitMQ consumer keyed on message_id) drop
-- a second message with an id they have seen, though the sweeper marked both
-- sent: two rows sharing an id lose one, silently. This index refuses the second
-- row when it is written.
--
-- It covers every row, dispatched ones too, not only outstanding ones. A
-- dispatched row stays until retention deletes it, and a second write of its id
-- meanwhile is the application reusing a key. If it is the same message written
-- again (a retried request), refusing it is right. If it is a different message,
-- the broker may still drop it as a duplicate (JetStream's window is 2 minutes
-- by default; a consumer's may be longer). A partial index would accept the
-- second write as soon as the first row was sent. Once retention has deleted a
-- row, its id can be written again.
--
-- The dead-letter table is not covered: a dead-lettered row has left the outbox,
-- and the application may write its id again (to send it corrected, say).
-- Replaying the dead letter while that row is still in the outbox fails, names
-- the id, and replays nothing. Two dead letters may share an id (the second
-- written after the first was dead-lettered); replaying both at once fails the
-- same way. An index there would make dead-lettering the second row fail, and
-- the sweeper would retry it forever.
--
-- What writers see: Writer.Write returns a DuplicateMessageIDError naming the
-- id. Plain SQL gets Postgres's unique_violation (SQLSTATE 23505) on the index
-- outbox_message_id_key. Either way the statement writes nothing and the
-- transaction is aborted: roll it back. An application that means to write a
-- message at most once can use INSERT ... ON CONFLICT (message_id) DO NOTHING.
--
-- Cost: every insert, and every sweep's mark of a row as dispatched (an update
-- that is never HOT, dispatched_at being indexed), adds an entry here. With
-- random ids (gen_random_uuid(), the default) it is the one index whose entries
-- do not append, which tells once it outgrows shared_buffers; ids that grow with
-- time (UUID version 7) keep it cheap (BENCHMARKS.md, "Unique message_id").
--
-- Building the index blocks inserts into the outbox while it reads the whole
-- table, dispatched rows included. To avoid that, build it beforehand without
-- blocking, and this migration finds it there:
--   CREATE UNIQUE INDEX CONCURRENTLY outbox_message_id_key ON outbox (message_id);
-- A concurrent build that fails (on duplicates, say) leaves an invalid index
-- behind. This migration refuses it: drop it with
--   DROP INDEX CONCURRENTLY outbox_message_id_key;
-- and build again.
--
-- If rows already share a message_id, the migration fails with an error that
-- says how many ids, one of them, and the query that lists them, and changes
-- nothing. Keep one row per id (delete a copy of a message written twice, or
-- give a different message a new id), then run migrate again.
--
-- Taking the lock for the build waits for running batch transactions. Wait at
-- most 10s for that, then fail (nothing changes, and migrate can be run again)
-- rather than holding the application's inserts behind a long wait. An index
-- built beforehand needs no lock here.
SET LOCAL lock_timeout = '10s';

DO $$
DECLARE
    idx       regclass := to_regclass('{{.schema}}.{{.prefix}}_message_id_key');
    shared    bigint;
    example   text;
BEGIN
    IF idx IS NOT NULL THEN
        IF NOT EXISTS (
            SELECT FROM pg_index i
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
            WHERE i.indexrelid = idx
              AND i.indrelid = '{{.outbox}}'::regclass
              AND i.indisunique AND i.indisvalid
              AND i.indnatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL
              AND a.attname = 'message_id'
        ) THEN
            RAISE EXCEPTION USING ERRCODE = 'object_not_in_prerequisite_state', MESSAGE = format(
                'the index %s.{{.prefix}}_message_id_key exists but is not a valid unique index on %s (message_id) '
                '(a CREATE UNIQUE INDEX CONCURRENTLY that failed leaves an invalid one behind): nothing was changed; '
                'drop it with DROP INDEX CONCURRENTLY %s.{{.prefix}}_message_id_key, then run migrate again',
                '{{.schema}}', '{{.outbox}}', '{{.schema}}');
        END IF;
        RETURN;
    END IF;

    BEGIN
        CREATE UNIQUE INDEX IF NOT EXISTS {{.prefix}}_message_id_key ON {{.outbox}} (message_id);
    EXCEPTION WHEN unique_violation THEN
        SELECT count(*), min(message_id::text) INTO shared, example
        FROM (SELECT message_id FROM {{.outbox}} GROUP BY message_id HAVING count(*) > 1) d;
        RAISE EXCEPTION USING ERRCODE = 'unique_violation', MESSAGE = format(
            'cannot make message_id unique in %s: %s message ids are each held by more than one row (%s among them); '
            'nothing was changed. List them with: '
            'SELECT message_id, array_agg(id ORDER BY id) AS ids, array_agg(dispatched_at ORDER BY id) AS dispatched_at '
            'FROM %s GROUP BY message_id HAVING count(*) > 1; '
            'keep one row per message_id (delete the copies of a message written twice, or give a different message '
            'its own id: UPDATE %s SET message_id = gen_random_uuid() WHERE id = ...), then run migrate again',
            '{{.outbox}}', shared, example, '{{.outbox}}', '{{.outbox}}');
    END;
END
$$;

---- create above / drop below ----

DROP INDEX {{.schema}}.{{.prefix}}_message_id_key;
