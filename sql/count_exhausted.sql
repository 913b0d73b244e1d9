-- Counts the rows of a batch ($1) that have failed at least $2 times, before
-- they are dead-lettered, so the storm guard can weigh them first.
SELECT count(*)
FROM {{outbox}}
WHERE id = ANY($1::bigint[])
  AND attempts >= $2
