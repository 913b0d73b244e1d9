-- Marks a sent batch dispatched, in the transaction that claimed it.
UPDATE {{outbox}}
SET dispatched_at = now()
WHERE id = ANY($1::bigint[])
