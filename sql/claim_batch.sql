-- Locks the rows of one batch that are still outstanding and that no other
-- transaction holds. The lock lasts until the batch's transaction ends, which is
-- after the broker has answered; rows another sweeper has in flight are skipped,
-- and a row dispatched since the page was read no longer matches.
SELECT id
FROM {{outbox}}
WHERE id = ANY($1::bigint[])
  AND dispatched_at IS NULL
ORDER BY id
FOR UPDATE SKIP LOCKED
