-- Records a failed send in the page's transaction, which claimed the rows: the
-- rows the failure policy charges ($2: the one row that failed alone, or none)
-- count an attempt and keep the error ($3); with $4 every row of the batch ($1)
-- keeps the error without an attempt (a topic refused them: the operator sees
-- why they wait). The claim's mark stays until the page's end, which undoes it
-- on every row not sent (unclaim.sql): a row of this batch may still be sent in
-- this page (the rest of a batch after rows the broker refused). No other
-- transaction can touch the rows meanwhile: this one holds their locks.
UPDATE {{outbox}}
SET attempts = attempts + (id = ANY($2::bigint[]))::int,
    last_error = CASE WHEN $4::boolean OR id = ANY($2::bigint[]) THEN $3 ELSE last_error END
WHERE id = ANY($1::bigint[])
