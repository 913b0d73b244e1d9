-- Fair paging reads each topic's outstanding rows by id, and finds the topics
-- that have any with a skip scan over this index: one index seek per topic, so
-- a tripped topic's backlog costs nothing however deep it is.
--
-- Building it blocks inserts into the outbox until it is done, which on a large
-- backlog can take a while. To avoid that, create it beforehand without
-- blocking, and this migration finds it there:
--   CREATE INDEX CONCURRENTLY outbox_outstanding_topic_idx ON outbox (topic, id)
--       WHERE dispatched_at IS NULL;
CREATE INDEX IF NOT EXISTS {{.prefix}}_outstanding_topic_idx ON {{.outbox}} (topic, id)
    WHERE dispatched_at IS NULL;

---- create above / drop below ----

DROP INDEX {{.schema}}.{{.prefix}}_outstanding_topic_idx;
