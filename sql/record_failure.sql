-- Records a failed send on the rows of a batch, in the transaction that claimed
-- it. The rows stay outstanding.
UPDATE {{outbox}}
SET attempts = attempts + 1,
    last_error = $2
WHERE id = ANY($1::bigint[])
