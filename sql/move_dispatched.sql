-- Moves the rows of a page the broker accepted ($1) from the outbox to its
-- history, in the page's transaction, just before it commits (in the same round
-- trip as the COMMIT). One statement deletes them from the outbox and inserts
-- them, every column kept, with dispatched_at the move's time: a row is in
-- exactly one table at every moment, whatever happens to the process, and a
-- page that rolls back leaves its rows outstanding in the outbox.
--
-- The page's transaction holds their locks (claim_page.sql), so nothing else
-- can have touched them. Rows of the page not sent (a failed batch, a topic
-- left out) are not named: they stay as they are, their failures' attempts and
-- errors kept (record_failure.sql). Rows dead-lettered meanwhile are gone from
-- the outbox and match nothing.
--
-- dispatched_at is clock_timestamp(), not now() (the transaction's start,
-- which may be minutes before during a drain of several pages): the history
-- partition a row lands in is the one current when it moved, so retention's
-- whole-partition drops keep each row at least its full retention.
--
-- The insert is routed to the partition of dispatched_at. If none covers it
-- (the sweeper creates them ahead; see outbox/partitions.go) the row lands in
-- the DEFAULT partition, which retention empties by row DELETE: the page never
-- fails for want of a partition.
WITH moved AS (
    DELETE FROM {{outbox}}
    WHERE id = ANY($1::bigint[])
    RETURNING *
)
INSERT INTO {{history}} (id, message_id, topic, payload, headers, content_type, correlation_id,
                         partition_key, created_at, dispatched_at, attempts, last_error, expires_at)
SELECT id, message_id, topic, payload, headers, content_type, correlation_id,
       partition_key, created_at, clock_timestamp(), attempts, last_error, expires_at
FROM moved
