-- The outbox becomes a small hot table: it holds outstanding rows only. A sent
-- row moves, in the page's transaction, to {{.history}}: one DELETE from the
-- outbox and one INSERT here (outbox/claim.go, sql/move_dispatched.sql), in
-- place of the mark (an UPDATE of dispatched_at that was never HOT, adding
-- entries to every index of the outbox) and, a retention period later, a row
-- DELETE. Retention retires history by dropping whole partitions, which
-- leaves no dead rows behind (outbox/partitions.go).
--
-- History is partitioned by dispatched_at. The sweeper creates the partitions
-- (named {{.prefix}}_h_YYYYMMDD_hhmmss by their start, in UTC), the current
-- one and the next two, at start and at each retention run; this migration
-- creates only the DEFAULT partition, the safety net that takes rows no
-- partition covers (retention empties it with a row DELETE), so that a page's
-- end never fails for want of a partition.
--
-- No index: each would cost a write per message, and the sweeper never reads
-- history. Retention drops partitions whole; an operator looking for a message
-- reads a partition or two by dispatched_at (the partitions' bounds prune the
-- rest). message_id is not unique here (README, "The outbox table").
--
-- Nothing here touches the outbox: creating new tables takes no lock on it, so
-- the upgrade never holds the application's inserts back, and sweepers of the
-- previous version may run on while it is applied (they go on marking rows in
-- the outbox, which retention deletes as before). Rows dispatched before the
-- upgrade stay in the outbox, marked, until retention deletes them.
--
-- IF NOT EXISTS, as the index builds of the earlier steps: a step run again
-- (a script applied by hand after a failure) finds its tables there.
CREATE TABLE IF NOT EXISTS {{.history}} (
    id              bigint      NOT NULL,
    message_id      uuid        NOT NULL,
    topic           text        NOT NULL,
    payload         bytea       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}',
    content_type    text,
    correlation_id  text,
    partition_key   text,
    created_at      timestamptz NOT NULL,
    dispatched_at   timestamptz NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    expires_at      timestamptz
) PARTITION BY RANGE (dispatched_at);

CREATE TABLE IF NOT EXISTS {{.history_default}} PARTITION OF {{.history}} DEFAULT;

---- create above / drop below ----

DROP TABLE {{.history}};
