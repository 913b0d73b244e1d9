-- Fair paging reads each topic's outstanding rows by id, and finds the topics
-- that have any with a skip scan over this index: one index seek per topic, so
-- a tripped topic's backlog costs nothing however deep it is.
CREATE INDEX {{.prefix}}_outstanding_topic_idx ON {{.outbox}} (topic, id)
    WHERE dispatched_at IS NULL;

---- create above / drop below ----

DROP INDEX {{.schema}}.{{.prefix}}_outstanding_topic_idx;
