-- Lists the topics that have outstanding rows, less those in $1 (tripped), with
-- a skip scan over the (topic, id) index: one index seek per topic, however deep
-- its backlog, so a tripped topic's rows cost nothing. The sweeper runs it once
-- per sweep (a tick's or a wake-up's); the sweep's pages read only the topics it
-- returned.
WITH RECURSIVE topics(topic) AS (
    (SELECT topic FROM {{outbox}} WHERE dispatched_at IS NULL ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT o.topic FROM {{outbox}} o
            WHERE o.dispatched_at IS NULL AND o.topic > t.topic
            ORDER BY o.topic LIMIT 1)
    FROM topics t
    WHERE t.topic IS NOT NULL
)
SELECT topic FROM topics
WHERE topic IS NOT NULL
  AND topic NOT IN (SELECT unnest($1::text[]))
