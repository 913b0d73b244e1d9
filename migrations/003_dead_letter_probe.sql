-- Where the dead-letter probe keeps its watermark: the newest dead letter its
-- last delivered alert reported. In the database rather than in memory, so that
-- a restart, or another instance taking over the probe, does not alert again
-- about the same dead letters.
CREATE TABLE {{.probe}} (
    id        boolean PRIMARY KEY DEFAULT true CHECK (id),
    watermark timestamptz NOT NULL DEFAULT 'epoch'
);
INSERT INTO {{.probe}} DEFAULT VALUES;

---- create above / drop below ----

DROP TABLE {{.probe}};
