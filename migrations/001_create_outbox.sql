-- The outbox and its dead-letter table. Names come from the sweeper's --schema and
-- --table flags: {{.outbox}} is the outbox table, {{.dead_letter}} its dead-letter
-- table, {{.prefix}} the bare table name used to name indexes.
--
-- Applications insert with plain SQL: every column but topic and payload has a
-- default.

CREATE TABLE {{.outbox}} (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id      uuid        NOT NULL DEFAULT gen_random_uuid(),
    topic           text        NOT NULL,
    payload         bytea       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}',
    content_type    text,
    correlation_id  text,
    partition_key   text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    dispatched_at   timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    CONSTRAINT {{.prefix}}_topic_not_empty CHECK (topic <> ''),
    CONSTRAINT {{.prefix}}_headers_object CHECK (jsonb_typeof(headers) = 'object')
);

-- Every hot query of the sweeper reads outstanding rows in id order. A partial
-- index holds only those, so a sweep costs the page it reads, however many
-- dispatched rows wait for retention. topic is included so that paging by topic
-- is answered from the index.
CREATE INDEX {{.prefix}}_outstanding_idx ON {{.outbox}} (id) INCLUDE (topic)
    WHERE dispatched_at IS NULL;

-- Retention deletes dispatched rows by age.
CREATE INDEX {{.prefix}}_dispatched_at_idx ON {{.outbox}} (dispatched_at)
    WHERE dispatched_at IS NOT NULL;

CREATE TABLE {{.dead_letter}} (
    id                bigint      PRIMARY KEY,
    message_id        uuid        NOT NULL,
    topic             text        NOT NULL,
    payload           bytea       NOT NULL,
    headers           jsonb       NOT NULL DEFAULT '{}',
    content_type      text,
    correlation_id    text,
    partition_key     text,
    created_at        timestamptz NOT NULL,
    dispatched_at     timestamptz,
    attempts          integer     NOT NULL DEFAULT 0,
    last_error        text,
    reason            text        NOT NULL,
    error             text,
    dead_lettered_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX {{.prefix}}_dead_letter_topic_idx ON {{.dead_letter}} (topic, dead_lettered_at);
CREATE INDEX {{.prefix}}_dead_letter_at_idx ON {{.dead_letter}} (dead_lettered_at);

---- create above / drop below ----

DROP TABLE {{.dead_letter}};
DROP TABLE {{.outbox}};
