-- Notes why topics wait: the topics in $1 were refused before paging (the
-- producer knew that no message can reach them, e.g. NATS: no stream captures
-- the subject), so none of their rows was claimed; each one's oldest
-- outstanding row gets the error of the same index in $2 as its last_error, so
-- that an operator looking at the rows sees why they wait. One row a topic,
-- found by a seek on the index of outstanding rows, and written only when the
-- text changes: a topic refused again at each trial writes no row again.
--
-- SKIP LOCKED: a row another sweeper's page holds (another instance, whose
-- view of the streams is older) is passed for the next one, rather than
-- waited for. A plain UPDATE waited out that page's sends, and held this
-- sweep, every topic of it, for as long (an independent review, 2026-11-29).
UPDATE {{outbox}} o
SET last_error = t.err
FROM (SELECT h.id, r.err
      FROM unnest($1::text[], $2::text[]) AS r(topic, err)
      CROSS JOIN LATERAL (
          SELECT i.id
          FROM {{outbox}} i
          WHERE i.topic = r.topic AND i.dispatched_at IS NULL
          ORDER BY i.topic, i.id
          LIMIT 1
          FOR UPDATE SKIP LOCKED
      ) h) t
WHERE o.id = t.id
  AND o.last_error IS DISTINCT FROM t.err
