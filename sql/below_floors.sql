-- Whether any outstanding row lies at or below the sweeper's cursor's floors
-- (outbox/cursor.go), where no sweep would read it: a row of a known topic
-- ($1) at or below its floor ($2), or a row of any other topic at or below the
-- discovery floor ($3); $1 may be NULL, for none. Sweeps never put one there; a row copied back by hand
-- with its own id (INSERT … OVERRIDING SYSTEM VALUE), or a writer stalled
-- between drawing its id and starting its transaction for longer than the
-- cursor waits, does. The sweeper runs it in the background once a minute and
-- reads every topic again from its first row only when it says yes.
--
-- It reads each topic that has outstanding rows once, by a skip scan over the
-- (topic, id) index: one seek to the topic's lowest outstanding id, which is
-- below the topic's floor (or, for a topic not known, below the discovery
-- floor) exactly when a row is. So it costs a seek per topic, however deep a
-- topic's backlog. Its first form walked the outstanding (id) index up to
-- the discovery floor to find rows of topics not known: every row of a known
-- topic's backlog, filtered out one by one, since a tripped topic's rows stay
-- below the discovery floor once it has passed them. A tripped topic of
-- 3,000,000 rows made that a 1.2 s statement, once a minute, per outbox
-- (issue 33's benchmark, pg_stat_statements).
--
-- Each seek still walks the dead entries at the head of its topic that a held
-- horizon keeps (the rows sent since it was taken): that is why it runs
-- beside the sweeps, not in them. Forgetting the floors blindly once a
-- minute, as the cursor did first, made a sweep pay that walk itself, per
-- topic and per page (the soak of issue 32: a 0.9 s claim and a 3 s stall as
-- a held snapshot ended).
--
-- Each seek is written as a row comparison on (topic, id), ordered by (topic,
-- id) and limited to one row, as live_topics.sql's probes are: the (topic, id)
-- index serves it whatever the statistics say, with a generic plan too. The
-- EXISTS stops the skip scan at the first topic found below its floor.
WITH RECURSIVE known AS (
    SELECT k.topic, max(k.after) AS after
    FROM unnest($1::text[], $2::bigint[]) AS k(topic, after)
    GROUP BY k.topic
), heads(topic, id) AS (
    (SELECT o.topic, o.id
     FROM {{outbox}} o
     WHERE o.dispatched_at IS NULL
     ORDER BY o.topic, o.id
     LIMIT 1)
    UNION ALL
    SELECT n.topic, n.id
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT o.topic, o.id
        FROM {{outbox}} o
        WHERE (o.topic, o.id) > (h.topic, 9223372036854775807)
          AND o.dispatched_at IS NULL
        ORDER BY o.topic, o.id
        LIMIT 1
    ) n
)
SELECT EXISTS (
    SELECT FROM heads h LEFT JOIN known k USING (topic)
    WHERE h.id <= coalesce(k.after, $3::bigint)
)
