-- Records a failed send in the transaction that claimed the batch: the claim's
-- mark is undone on every claimed row ($1), so they stay outstanding; the rows
-- the failure policy charges ($2: the one row that failed alone, or none) count
-- an attempt and keep the error ($3); with $4 every claimed row keeps the error
-- without an attempt (a topic refused them: the operator sees why they wait).
-- No other transaction can touch the rows meanwhile: this one holds their locks.
UPDATE {{outbox}}
SET dispatched_at = NULL,
    attempts = attempts + (id = ANY($2::bigint[]))::int,
    last_error = CASE WHEN $4::boolean OR id = ANY($2::bigint[]) THEN $3 ELSE last_error END
WHERE id = ANY($1::bigint[])
