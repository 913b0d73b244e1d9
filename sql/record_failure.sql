-- Records a failed send in the page's transaction, which claimed the rows: the
-- rows the failure policy charges ($2: the one row that failed alone, or none)
-- count an attempt and keep the error ($3); with $4 every row of the batch ($1)
-- keeps the error without an attempt (a topic refused them: the operator sees
-- why they wait). The rows stay in the outbox, outstanding; a row of this batch
-- may still be sent in this page (the rest of a batch after rows the broker
-- refused), and then moves to history at the page's end with what was recorded
-- here. No other transaction can touch the rows meanwhile: this one holds
-- their locks. attempts and last_error are in no index, so this update is HOT
-- when the page has room.
--
-- It returns each row's new ctid: the update made a new version of the row,
-- and the page's end finds a sent row by where its latest version is
-- (move_dispatched.sql).
UPDATE {{outbox}}
SET attempts = attempts + (id = ANY($2::bigint[]))::int,
    last_error = CASE WHEN $4::boolean OR id = ANY($2::bigint[]) THEN $3 ELSE last_error END
WHERE id = ANY($1::bigint[])
RETURNING id, ctid
