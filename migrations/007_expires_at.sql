-- Message expiry. A row may carry a deadline (expires_at, NULL for none), and
-- the sweeper may be given a maximum age per topic; a row past either is never
-- sent: the sweeper moves it to the dead-letter table with reason expired.
--
-- The dead-letter table keeps the deadline with the row, so that a replay
-- knows it (replay clears it only for rows that expired: the operator asked
-- for them).
--
-- The partial index holds only outstanding rows that carry a deadline, so it
-- costs nothing to applications that never set one, and lets each tick find
-- the rows past their deadline, in any topic, without reading the others.
-- Adding a nullable column without a default changes only the catalog; the
-- index is built from the outstanding rows that have a deadline, which before
-- this migration is none, but the build reads the table once under a lock that
-- holds writes back: on a table of many millions of rows, create it first with
-- CREATE INDEX CONCURRENTLY under the same name (README, "Upgrading to migration 7").
SET LOCAL lock_timeout = '10s';

ALTER TABLE {{.outbox}} ADD COLUMN IF NOT EXISTS expires_at timestamptz;
ALTER TABLE {{.dead_letter}} ADD COLUMN IF NOT EXISTS expires_at timestamptz;

CREATE INDEX IF NOT EXISTS {{.prefix}}_expires_at_idx ON {{.outbox}} (expires_at)
    WHERE dispatched_at IS NULL AND expires_at IS NOT NULL;

-- A concurrent build that failed leaves an invalid index of the name, which
-- IF NOT EXISTS would take for the real one and the planner would never use.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_index WHERE indexrelid = to_regclass('{{.schema}}.{{.prefix}}_expires_at_idx') AND NOT indisvalid) THEN
        RAISE EXCEPTION USING ERRCODE = 'object_not_in_prerequisite_state', MESSAGE = format(
            'the index %s.{{.prefix}}_expires_at_idx exists but is not valid (a CREATE INDEX CONCURRENTLY that failed '
            'leaves one behind): nothing was changed; drop it with DROP INDEX CONCURRENTLY %s.{{.prefix}}_expires_at_idx, '
            'then run migrate again', '{{.schema}}', '{{.schema}}');
    END IF;
END
$$;

-- The storm guard counts a topic's recent dead letters other than expired
-- ones (an outage longer than --max-age expires a whole backlog, by design,
-- and that is no storm). Its count reads this index only, however many rows
-- expired.
CREATE INDEX IF NOT EXISTS {{.prefix}}_dead_letter_storm_idx ON {{.dead_letter}} (topic, dead_lettered_at)
    WHERE reason <> 'expired';

---- create above / drop below ----

DROP INDEX IF EXISTS {{.schema}}.{{.prefix}}_dead_letter_storm_idx;
DROP INDEX IF EXISTS {{.schema}}.{{.prefix}}_expires_at_idx;
ALTER TABLE {{.dead_letter}} DROP COLUMN IF EXISTS expires_at;
ALTER TABLE {{.outbox}} DROP COLUMN IF EXISTS expires_at;
