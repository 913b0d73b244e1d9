-- Claims the rows of one batch and marks them dispatched, in the batch's
-- transaction, before the send. Only rows still outstanding and not held by
-- another transaction are taken (SKIP LOCKED): rows another sweeper has in flight
-- are skipped, and a row dispatched since the page was read no longer matches.
-- The mark becomes visible only when the transaction commits, after the broker
-- has accepted the batch; a failed send undoes it (record_failure.sql) and a
-- crash rolls it back. RETURNING order is unspecified: the caller sorts.
UPDATE {{outbox}}
SET dispatched_at = now()
WHERE id IN (
    SELECT id
    FROM {{outbox}}
    WHERE id = ANY($1::bigint[])
      AND dispatched_at IS NULL
    FOR UPDATE SKIP LOCKED
)
RETURNING id
