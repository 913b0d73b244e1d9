-- Reads and claims a page in one statement, in the page's transaction: up to a
-- share of outstanding rows of each topic, read in id order from where the
-- topic's previous page ended, locked and marked dispatched. The marks become
-- visible only when the transaction commits, after the sends; the page's end
-- undoes the mark of every row the broker did not accept (unclaim.sql), and a
-- crash rolls everything back.
--
--   $1  the topics to read (from outstanding_topics.sql, less those stopped)
--   $2  per topic, the last id already paged in this sweep (0 for none)
--   $3  per topic, its advisory lock key (--ordering topic)
--   $4  the share: the most rows read per topic
--   $5  whether to take each topic's lock (--ordering topic)
--   $6  idle_in_transaction_session_timeout for this transaction, e.g. '20000ms'
--
-- It returns the claimed rows (summary false), then one summary row per topic
-- that had outstanding rows: how many it read (candidates, locked or not), the
-- last id it read, and whether the topic's lock was taken. Candidates less
-- claimed rows are rows another transaction holds (SKIP LOCKED): under
-- --ordering none they wait for a later sweep; under --ordering topic a topic
-- that did not get all of them sends none (the sweeper undoes their marks), so
-- nothing overtakes a row in flight elsewhere.
--
-- Why one statement and one transaction for the whole page rather than one per
-- batch: at 1,000 topics a page's share is one row a topic, and a transaction
-- per topic drained 2,300 rows a second where the database alone claims 40,000.
-- Reading and claiming together also reads each row once.
--
-- As in claim_batch.sql: $6 bounds how long a frozen sweeper holds the rows (the
-- sweeper keeps the transaction from idling that long while it sends), the
-- transaction commits without waiting for its WAL (a mark lost in a crash of
-- Postgres means a row sent again, never a row lost), and each topic's lock,
-- taken with pg_try_advisory_xact_lock, goes with the transaction.
--
-- The claimed rows come back from the UPDATE as ids and attempts (read under the
-- lock), and the rest is read by id from the statement's snapshot, which holds
-- the same row as it was before the mark: payloads and headers never change.
-- Returning whole rows from the UPDATE cost more (they pass through the CTE's
-- tuplestore).
--
-- The candidates are read through the (topic, id) index with row comparisons,
-- as in page_outstanding.sql (which explains why), and locked and marked
-- through the primary key. The ids go from step to step as arrays (= ANY
-- (ARRAY(…))), not as IN (subquery): pgx prepares the statement, and after five
-- runs Postgres may keep a generic plan, which cannot see the share ($4) and
-- planned IN as a hash join over a sequential scan of the whole table (98 ms
-- for a 500-row page of a 100,000-row table, against 13 ms).
WITH settings AS MATERIALIZED (
    SELECT set_config('idle_in_transaction_session_timeout', $6::text, true) AS idle_timeout,
           set_config('synchronous_commit', 'off', true) AS synchronous_commit
), topics AS MATERIALIZED (
    SELECT l.topic, l.after,
           CASE WHEN $5::boolean THEN pg_try_advisory_xact_lock(l.key) ELSE true END AS held
    FROM settings, unnest($1::text[], $2::bigint[], $3::bigint[]) AS l(topic, after, key)
), candidates AS MATERIALIZED (
    SELECT t.topic, t.held, p.id
    FROM topics t
    CROSS JOIN LATERAL (
        SELECT o.id
        FROM {{outbox}} o
        WHERE (o.topic, o.id) > (t.topic, t.after)
          AND (o.topic, o.id) <= (t.topic, 9223372036854775807)
          AND o.dispatched_at IS NULL
        ORDER BY o.topic, o.id
        LIMIT $4
    ) p
), claimed AS (
    UPDATE {{outbox}}
    SET dispatched_at = now()
    WHERE id = ANY (ARRAY(
        SELECT o.id
        FROM {{outbox}} o
        WHERE o.id = ANY (ARRAY(SELECT c.id FROM candidates c WHERE c.held))
          AND o.dispatched_at IS NULL
        FOR UPDATE OF o SKIP LOCKED
    ))
    RETURNING id, attempts
)
SELECT false AS summary, o.id, o.message_id::text, o.topic, o.payload, o.headers, o.content_type, o.correlation_id,
       o.partition_key, o.created_at, c.attempts, NULL::bigint AS candidates, NULL::boolean AS held
FROM claimed c
JOIN {{outbox}} o ON o.id = c.id
UNION ALL
SELECT true, max(id), NULL, topic, NULL, NULL, NULL, NULL, NULL, NULL, NULL, count(*), bool_and(held)
FROM candidates
GROUP BY topic
