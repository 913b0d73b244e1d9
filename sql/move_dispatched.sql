-- Moves the rows of a page the broker accepted from the outbox to its history,
-- in the page's transaction, just before it commits (in the same round trip as
-- the COMMIT). One statement deletes them from the outbox and inserts them,
-- every column kept, with dispatched_at the move's time: a row is in exactly
-- one table at every moment, whatever happens to the process, and a page that
-- rolls back leaves its rows outstanding in the outbox.
--
--   $1  the sent rows' ctids: where the page's claim locked each one, or where
--       the page's own record of a failure put its new version
--       (record_failure.sql returns it)
--
-- The rows are found by ctid (a TID scan), not by id: a lookup of each id in
-- the primary key cost a descent of the index a row, and the move took a
-- tenth more time for it (4,000-row moves of a drain, issue 32). A ctid names
-- the row the page locked, and only it: the page's transaction holds that
-- version's lock from its claim (claim_page.sql locks by ctid and returns
-- the ctid it locked), so no other transaction can update or delete it, and
-- vacuum cannot free its slot while the transaction runs. The one statement
-- that makes a new version meanwhile is the page's own record of a failure,
-- and the page takes the new ctid from it.
--
-- The statement checks that it moved every row it was given, and fails
-- otherwise (a cast of the message to bigint), so that the page rolls back
-- rather than commit a move that left a sent row outstanding or took one the
-- page did not hold: a page that rolls back sends its rows again, nothing is
-- lost. It never fails unless the reasoning above is wrong.
--
-- Rows of the page not sent (a failed batch, a topic left out) are not named:
-- they stay as they are, their failures' attempts and errors kept. Rows
-- dead-lettered meanwhile are gone from the outbox and are not named either.
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
    WHERE ctid = ANY($1::tid[])
    RETURNING *
), kept AS (
    INSERT INTO {{history}} (id, message_id, topic, payload, headers, content_type, correlation_id,
                             partition_key, created_at, dispatched_at, attempts, last_error, expires_at)
    SELECT id, message_id, topic, payload, headers, content_type, correlation_id,
           partition_key, created_at, clock_timestamp(), attempts, last_error, expires_at
    FROM moved
    RETURNING 1
)
SELECT CASE WHEN count(*) = cardinality($1::tid[]) THEN count(*)
            ELSE ('the page moved ' || count(*) || ' of its ' || cardinality($1::tid[])
                  || ' sent rows: a row was not where the page locked it; the page rolls back and its rows are sent again')::bigint
       END
FROM kept
