-- Reads and claims a page in one statement, in the page's transaction (which, during
-- a drain, claims the next page in the same way while this one sends): up to a
-- share of outstanding rows of each topic, read in id order from where the
-- topic's previous page ended, and locked (FOR UPDATE SKIP LOCKED). The lock is
-- the claim: nothing is written. At the page's end the rows the broker accepted
-- move to the history table in one statement (move_dispatched.sql), and the
-- transaction commits; every other row is left as it is, outstanding, and a
-- crash rolls everything back.
--
--   $1  the topics to read (from outstanding_topics.sql, less those stopped)
--   $2  per topic, the last id already paged in this sweep (0 for none)
--   $3  per topic, its advisory lock key (--ordering topic)
--   $4  the share: the most rows read per topic
--   $5  whether to take each topic's lock (--ordering topic)
--   $6  idle_in_transaction_session_timeout for this transaction, e.g. '20000ms'
--
-- It returns the claimed rows (summary false), each with the ctid it was
-- locked at (the page's end deletes it there: move_dispatched.sql), then one summary row per topic
-- that had outstanding rows: how many it read (candidates, locked or not), the
-- last id it read and the first (the sweeper's cursor keeps a topic's floor
-- below rows it read but could not claim). Candidates less claimed rows are rows another
-- transaction holds (SKIP LOCKED), or all of a topic whose lock another sweeper
-- holds: under --ordering none they wait for a later sweep; under --ordering
-- topic a topic that did not get all of them sends none (its rows are left
-- outstanding), so nothing overtakes a row in flight elsewhere.
--
-- Why one statement and one transaction for the whole page rather than one per
-- batch: at 1,000 topics a page's share is one row a topic, and a transaction
-- per topic drained 2,300 rows a second where the database alone claims 40,000.
-- Reading and claiming together also reads each row once.
--
-- With $5 set, each topic's transaction-scoped advisory lock is tried first,
-- and a topic whose lock another sweeper holds is read but not claimed: at most
-- one sweeper sends a topic at a time. The locks go with the transaction, so a
-- sweeper that dies frees them at once.
--
-- The transaction then sits idle while the broker answers. $6 bounds that for
-- this transaction only (set_config(…, true) is SET LOCAL): if this sweeper
-- freezes or its host vanishes without closing the connection, Postgres ends
-- the session after $6 and the rows and the locks go to other sweepers (a live
-- sweeper keeps the transaction from idling that long while its sends go on).
-- Set here rather than per session so it reaches nothing else the pool's
-- sessions do, and passes through connection poolers. settings is read before
-- the topics, and so before any row is looked at, whatever plan is picked.
--
-- The transaction commits without waiting for its WAL to reach disk
-- (synchronous_commit off, for it alone). Its move says "sent"; if Postgres
-- crashes before it flushes it (a fraction of a second, wal_writer_delay
-- times three at most), the rows are back in the outbox after recovery and are
-- sent again: a duplicate, which at-least-once allows, never a loss (the rows
-- themselves were committed by the application with its own settings). WAL is
-- flushed in order, so what is lost is always the latest moves, and a topic's
-- rows come again in id order. The same holds for what a failure records in
-- this transaction (attempts, a move to the dead-letter table): lost, the row
-- is tried again.
--
-- Why no mark at claim: the mark was an UPDATE of dispatched_at, which is in
-- the partial indexes' predicates, so it was never HOT and added an entry to
-- every index of the outbox, and its old version stayed until vacuum (issue
-- 32). The move at the page's end is now the row's only write after the
-- application's insert. A row lock makes no new row version: it sets the
-- tuple's xmax in place (a small WAL record), and the indexes do not see it.
--
-- Each topic's candidates are read through the (topic, id) index in id order.
-- Its range is written as row comparisons on (topic, id), not as topic = … AND
-- id > …, and ordered by (topic, id), so that the (topic, id) index serves it
-- without a sort. Written plainly, the planner may walk the primary key in id
-- order and filter, betting that the LIMIT stops it early; when its statistics
-- predate a drain, that bet reads every dispatched row in each page (a second a
-- page at 100,000 rows). The candidates are then locked, and read whole,
-- through the primary key. The ids go from step to step as arrays
-- (= ANY (ARRAY(…))), not as IN (subquery): pgx prepares the statement, and after five runs Postgres
-- may keep a generic plan, which cannot see the share ($4) and planned IN as a
-- hash join over a sequential scan of the whole table (98 ms for a 500-row
-- page of a 100,000-row table, against 13 ms).
--
-- The candidates are locked by their ctid (a TID scan, which fetches exactly
-- those tuples), not by id. While something holds the vacuum horizon the
-- outbox is a few live rows among hundreds of thousands of dead ones: its
-- statistics then say a handful of rows, its indexes are large, and the
-- planner reckons every index fetch costs pages in proportion. The soak
-- (issue 32) caught it locking by id through a full scan of the (topic, id)
-- index, every entry ever sent since the horizon was held (220,000 buffers,
-- 0.7 to 1.2 s a page, the relay at 250 rows/s against 3,000 offered). A TID
-- scan has no such choice. A row updated and committed by another
-- transaction between the read and the lock fails the TID recheck and is left
-- for a later sweep, as a row held elsewhere is; its ctid cannot be reused
-- meanwhile, since this statement's snapshot still sees it.
--
-- The lock's check that the row is still outstanding is written as a CASE, not
-- as dispatched_at IS NULL, so that it does not match the partial indexes'
-- predicate: matched, it lets the planner scan a partial index whole and
-- filter on ctid, which it prefers to the TID scan while the outbox is small.
-- The plan is generic and each connection keeps it until the table's
-- statistics change, so a quiet outbox's claim planned when it held ten rows
-- then read every row of the backlog an outage left (345 ms for a 500-row page
-- of 100,000 rows, against 2 ms) until autovacuum analyzed the table. Left
-- with no index to scan, the planner has only the TID scan and a sequential
-- scan, which the page's settings rule out.
WITH settings AS MATERIALIZED (
    SELECT set_config('idle_in_transaction_session_timeout', $6::text, true) AS idle_timeout,
           set_config('synchronous_commit', 'off', true) AS synchronous_commit
), topics AS MATERIALIZED (
    SELECT l.topic, l.after,
           CASE WHEN $5::boolean THEN pg_try_advisory_xact_lock(l.key) ELSE true END AS held
    FROM settings, unnest($1::text[], $2::bigint[], $3::bigint[]) AS l(topic, after, key)
), candidates AS MATERIALIZED (
    SELECT t.topic, t.held, p.id, p.ctid
    FROM topics t
    CROSS JOIN LATERAL (
        SELECT o.id, o.ctid
        FROM {{outbox}} o
        WHERE (o.topic, o.id) > (t.topic, t.after)
          AND (o.topic, o.id) <= (t.topic, 9223372036854775807)
          AND o.dispatched_at IS NULL
        ORDER BY o.topic, o.id
        LIMIT $4
    ) p
), claimed AS MATERIALIZED (
    SELECT o.id, o.message_id, o.topic, o.payload, o.headers, o.content_type, o.correlation_id,
           o.partition_key, o.created_at, o.expires_at, o.attempts, o.ctid
    FROM {{outbox}} o
    WHERE o.ctid = ANY (ARRAY(SELECT c.ctid FROM candidates c WHERE c.held))
      AND CASE WHEN o.dispatched_at IS NULL THEN true ELSE false END
    FOR UPDATE OF o SKIP LOCKED
)
SELECT false AS summary, c.id, c.message_id::text, c.topic, c.payload, c.headers, c.content_type, c.correlation_id,
       c.partition_key, c.created_at, c.expires_at, c.attempts, NULL::bigint AS candidates, NULL::bigint AS first, c.ctid
FROM claimed c
UNION ALL
SELECT true, max(id), NULL, topic, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, count(*), min(id), NULL::tid
FROM candidates
GROUP BY topic
