-- Reads the next page of outstanding rows in id order, without locking them: the
-- rows are claimed batch by batch later (claim_batch.sql). $2 lists topics to leave
-- out, those that already failed in this tick. $3 is the last id of the previous
-- page of the same sweep (0 for the first): the index scan starts after it instead
-- of stepping over the entries of every row dispatched since the last vacuum. The
-- partial index on outstanding rows serves the scan, so its cost is the page, not
-- the table.
SELECT id, message_id::text, topic, payload, headers, content_type, correlation_id,
       partition_key, created_at, attempts
FROM {{outbox}}
WHERE dispatched_at IS NULL
  AND NOT (topic = ANY($2::text[]))
  AND id > $3
ORDER BY id
LIMIT $1
