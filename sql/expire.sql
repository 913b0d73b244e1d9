-- Moves outstanding rows past their deadline to the dead-letter table with
-- reason expired, in one statement, for the rows no page is claiming: those of
-- the topics the sweeper leaves out (tripped, cooling down, backing off, or
-- every topic while the broker's breaker is open), and, in every topic, those
-- whose own expires_at has passed. Rows a page claims are checked as the page
-- is claimed, in its transaction (sweep.go), so a row never goes to the broker
-- after its deadline; this statement makes sure that the rows of a topic that
-- is not sent expire on schedule too, and cannot pile up unseen.
--
--   $1  topics whose rows expire by age (those left out, with a max age)
--   $2  per topic, its max age in milliseconds
--   $3  the most rows to move, per part
--   $4  per topic, the error recorded for rows past its max age
--
-- By age, each topic's first outstanding row (lowest id) is read through the
-- (topic, id) index, one index probe a topic: only topics whose first row is
-- past their max age are read further, $3 rows each in id order, and at most
-- $3 rows in all move by age per statement (the caller runs it again while
-- rows move). So a tick where nothing has expired costs a probe a topic,
-- however deep the backlogs. Ids are drawn at insert and created_at at the
-- transaction's start, so within a topic they agree except for the rows of
-- long transactions: a row behind a younger one is found once the rows before
-- it have gone (or expired), at most the length of that transaction late.

-- By deadline, the partial index on expires_at holds only outstanding rows
-- that carry one, read from the earliest.
--
-- Rows another transaction holds (a page in flight) are skipped: that page
-- checks them itself. Rows are locked and moved by ctid, for the reason
-- claim_page.sql gives: by id, a planner misled by a held horizon's dead rows
-- may scan a whole index to find them; and their check that the row is
-- still outstanding is a CASE, which keeps a plan made while the outbox was
-- small from scanning a partial index whole (claim_page.sql says how). Returns the moved rows' topics and correlation ids.
WITH due AS MATERIALIZED (
    SELECT t.topic, t.max_age_ms
    FROM unnest($1::text[], $2::bigint[]) AS t(topic, max_age_ms)
    WHERE (SELECT o.created_at
           FROM {{outbox}} o
           WHERE (o.topic, o.id) > (t.topic, 0)
             AND (o.topic, o.id) <= (t.topic, 9223372036854775807)
             AND o.dispatched_at IS NULL
           ORDER BY o.topic, o.id
           LIMIT 1) <= now() - t.max_age_ms * interval '1 millisecond'
), aged AS (
    SELECT p.ctid
    FROM due t
    CROSS JOIN LATERAL (
        SELECT o.ctid, o.created_at
        FROM {{outbox}} o
        WHERE (o.topic, o.id) > (t.topic, 0)
          AND (o.topic, o.id) <= (t.topic, 9223372036854775807)
          AND o.dispatched_at IS NULL
        ORDER BY o.topic, o.id
        LIMIT $3
    ) p
    WHERE p.created_at <= now() - t.max_age_ms * interval '1 millisecond'
    LIMIT $3
), deadlined AS (
    SELECT o.ctid
    FROM {{outbox}} o
    WHERE o.expires_at <= now()
      AND o.dispatched_at IS NULL
      AND o.expires_at IS NOT NULL
    ORDER BY o.expires_at
    LIMIT $3
), locked AS (
    SELECT o.ctid
    FROM {{outbox}} o
    WHERE o.ctid = ANY (ARRAY(SELECT ctid FROM aged UNION SELECT ctid FROM deadlined))
      AND CASE WHEN o.dispatched_at IS NULL THEN true ELSE false END
    FOR UPDATE OF o SKIP LOCKED
), moved AS (
    DELETE FROM {{outbox}}
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM locked))
    RETURNING *
)
INSERT INTO {{dead_letter}} (id, message_id, topic, payload, headers, content_type, correlation_id,
                             partition_key, created_at, expires_at, dispatched_at, attempts, last_error, reason,
                             error, dead_lettered_at)
SELECT m.id, m.message_id, m.topic, m.payload, m.headers, m.content_type, m.correlation_id,
       m.partition_key, m.created_at, m.expires_at, NULL, m.attempts, m.last_error, 'expired',
       CASE WHEN m.expires_at <= now() THEN 'its expires_at passed before it could be sent' ELSE t.why END,
       clock_timestamp()
FROM moved m
LEFT JOIN unnest($1::text[], $4::text[]) AS t(topic, why) ON t.topic = m.topic
RETURNING topic, correlation_id
