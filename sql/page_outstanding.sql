-- Reads outstanding rows of topics without locking them: the half-open broker
-- breaker's trial looks for its batch with it (the trial then claims the rows
-- by id: claim_batch.sql). Pages are read and claimed by claim_page.sql.
--
--   $1  the topics to read (from outstanding_topics.sql, less those stopped)
--   $2  per topic, the last id already paged in this tick (0 for none)
--   $3  the share: the most rows read per topic
--
-- Each topic's rows are read through the (topic, id) index in id order, at most
-- a share each, so one topic's backlog cannot fill every page. A topic that
-- returned its whole share may have more: the sweeper pages again.
--
-- The topic's range is written as row comparisons on (topic, id), not as
-- topic = … AND id > …, and ordered by (topic, id), so that the (topic, id)
-- index is the one that serves it without a sort. Written plainly, the planner may walk the primary key in
-- id order and filter, betting that the LIMIT stops it early; when its
-- statistics predate a drain, that bet reads every dispatched row in each page
-- (a second a page at 100,000 rows).
SELECT p.id, p.message_id::text, p.topic, p.payload, p.headers, p.content_type, p.correlation_id,
       p.partition_key, p.created_at, p.attempts
FROM unnest($1::text[], $2::bigint[]) AS l(topic, after)
CROSS JOIN LATERAL (
    SELECT o.id, o.message_id, o.topic, o.payload, o.headers, o.content_type, o.correlation_id,
           o.partition_key, o.created_at, o.attempts
    FROM {{outbox}} o
    WHERE (o.topic, o.id) > (l.topic, l.after)
      AND (o.topic, o.id) <= (l.topic, 9223372036854775807)
      AND o.dispatched_at IS NULL
    ORDER BY o.topic, o.id
    LIMIT $3
) p
ORDER BY p.id
