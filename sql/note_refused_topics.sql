-- Notes why topics wait: the topics in $1 were refused before paging (the
-- producer knew that no message can reach them, e.g. NATS: no stream captures
-- the subject), so none of their rows was claimed; each one's oldest
-- outstanding row gets the error of the same index in $2 as its last_error, so
-- that an operator looking at the rows sees why they wait. One row a topic,
-- found by a seek on the index of outstanding rows, and written only when the
-- text changes: a topic refused again at each trial writes no row again.
UPDATE {{outbox}} o
SET last_error = r.err
FROM unnest($1::text[], $2::text[]) AS r(topic, err)
WHERE o.id = (SELECT min(i.id) FROM {{outbox}} i WHERE i.topic = r.topic AND i.dispatched_at IS NULL)
  AND o.last_error IS DISTINCT FROM r.err
