-- Records a failed send in the transaction that claimed the batch: the claim's
-- mark is undone on every claimed row ($1), so they stay outstanding, and the
-- rows the failure concerns ($2: all of them, or those a message-class error
-- names) count an attempt and keep the error ($3). No other transaction can touch
-- the rows meanwhile: this one holds their locks.
UPDATE {{outbox}}
SET dispatched_at = NULL,
    attempts = attempts + (id = ANY($2::bigint[]))::int,
    last_error = CASE WHEN id = ANY($2::bigint[]) THEN $3 ELSE last_error END
WHERE id = ANY($1::bigint[])
