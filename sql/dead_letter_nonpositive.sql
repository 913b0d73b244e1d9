-- Moves outstanding rows whose id is not positive to the dead-letter table,
-- reason invalid_id, at most $1 of them, and returns each one's topic.
--
-- The identity column draws ids from 1 up, and the sweeper reads every topic
-- from above a floor that starts at 0 (outbox/cursor.go): a row written with
-- an id of 0 or less (INSERT … OVERRIDING SYSTEM VALUE, a copy from another
-- table) would never be sent, and the check of the floors, finding it below
-- them, made every sweep read every topic from its first row again, once a
-- minute, for as long as it stayed (an independent review, 2026-11-29). In
-- the dead-letter table it is seen, alerted on, and sent by a replay, which
-- writes it again under an id of its own.
--
-- One seek on the outstanding (id) index finds them, and none is found at
-- once. SKIP LOCKED: a row held elsewhere waits for the next check. Should
-- the dead-letter table hold one of these ids already, the statement fails
-- whole, and moves nothing.
WITH locked AS (
    SELECT o.ctid
    FROM {{outbox}} o
    WHERE o.id <= 0 AND o.dispatched_at IS NULL
    ORDER BY o.id
    LIMIT $1
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
       m.partition_key, m.created_at, m.expires_at, NULL, m.attempts, m.last_error, 'invalid_id',
       'its id ' || m.id || ' is not positive: the sweeper reads ids from 1 up and would never send it; '
           || 'replay it (sweeper dlq replay --reason invalid_id) to send it under an id of its own',
       clock_timestamp()
FROM moved m
RETURNING topic
