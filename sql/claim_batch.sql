-- Claims the rows of one batch by id and marks them dispatched, in the batch's
-- transaction, before the send: the half-open broker breaker's trial, whose
-- rows were read first (page_outstanding.sql). Pages are claimed by
-- claim_page.sql. Only rows still outstanding and not held by
-- another transaction are taken (SKIP LOCKED): rows another sweeper has in flight
-- are skipped, and a row dispatched since the page was read no longer matches.
-- The mark becomes visible only when the transaction commits, after the broker
-- has accepted the batch; a failed send undoes it (record_failure.sql) and a
-- crash rolls it back. RETURNING order is unspecified: the caller sorts. It
-- returns each row's attempts as they are under the lock, for the failure policy.
--
--   $1  the batch's ids
--   $2  whether to take the topic's lock first (--ordering topic)
--   $3  the topic's advisory lock key
--   $4  idle_in_transaction_session_timeout for this transaction, e.g. '20000ms'
--
-- With $2 set, the claim first tries the topic's transaction-scoped advisory
-- lock, and claims nothing when another sweeper's batch of the topic holds it:
-- at most one sweeper sends a topic at a time. The lock goes with the
-- transaction, so a sweeper that dies frees it at once. CASE keeps the lock
-- from being taken when $2 is not set.
--
-- The transaction then sits idle while the broker answers. $4 bounds that for
-- this transaction only (set_config(…, true) is SET LOCAL): if this sweeper
-- freezes or its host vanishes without closing the connection, Postgres ends
-- the session after $4 and the rows and the lock go to other sweepers. Set here
-- rather than per session so it reaches nothing else the pool's sessions do,
-- and passes through connection poolers.
--
-- The transaction commits without waiting for its WAL to reach disk
-- (synchronous_commit off, for it alone). Its marks say "sent"; if Postgres
-- crashes before it flushes them (a fraction of a second, wal_writer_delay
-- times three at most), the rows are outstanding again after recovery and are
-- sent again: a duplicate, which at-least-once allows, never a loss (the rows
-- themselves were committed by the application with its own settings). WAL is
-- flushed in order, so what is lost is always the latest marks, and a topic's
-- rows come again in id order. The same holds for what a failure records in
-- this transaction (attempts, a move to the dead-letter table): lost, the row
-- is tried again. Waiting for the flush cost each batch a disk sync.
--
-- All three happen once, before any row is looked at, whatever plan the planner
-- picks: the uncorrelated (SELECT held FROM topic_lock) is a one-time filter
-- over the whole update (EXPLAIN: "One-Time Filter"), so the timeout is set
-- before the first row is locked, and no row is locked when the topic's lock
-- is not held. Joined to the rows instead, the CTE ran only when some row
-- matched, in an order the plan decided.
WITH topic_lock AS MATERIALIZED (
    SELECT set_config('idle_in_transaction_session_timeout', $4::text, true) AS idle_timeout,
           set_config('synchronous_commit', 'off', true) AS synchronous_commit,
           CASE WHEN $2::boolean THEN pg_try_advisory_xact_lock($3::bigint) ELSE true END AS held
)
UPDATE {{outbox}}
SET dispatched_at = now()
WHERE (SELECT held FROM topic_lock)
  AND id IN (
    SELECT o.id
    FROM {{outbox}} o
    WHERE o.id = ANY($1::bigint[])
      AND o.dispatched_at IS NULL
    FOR UPDATE OF o SKIP LOCKED
  )
RETURNING id, attempts
