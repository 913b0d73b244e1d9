-- Lists the topics a sweep reads, from where the sweeper's cursor says their
-- outstanding rows begin (outbox/cursor.go), so that the listing never walks
-- again the index entries of rows already sent. A scan from a topic's lowest
-- id visits every entry that dispatched and deleted rows left in the
-- outstanding indexes, and while something holds the vacuum horizon (a long
-- report, pg_dump, a replica with hot_standby_feedback) those entries cannot
-- go: the old listing's skip scan read each topic from its first entry and
-- slowed with every row sent.
--
--   $1  the topics known to have outstanding rows (the cursor's members, less
--       those left out of this sweep)
--   $2  per topic, its floor: every outstanding row has a higher id
--   $3  the discovery floor: every outstanding row at or below it belongs to
--       a known topic
--   $4  the most rows each half of the discovery scan reads
--   $5  the highest id the discovery scan has read (since the cursor's
--       reset): rows above it are new
--
-- It returns one row per known topic (kind 0), saying whether it has an
-- outstanding row above its floor and the first one's id (one probe of the
-- (topic, id) index each: the sweep's first page of the topic starts there, and
-- does not walk again what the probe walked);
-- one row per topic with outstanding rows above the discovery floor (kind 1),
-- with the highest id read, read in id order through the outstanding (id)
-- index; one row (kind 2) with the statement's snapshot's xmin and xmax,
-- which the cursor needs to know when rows it could not see have all
-- committed; and one row (kind 3) with how many rows the first half of the
-- discovery scan (below) read again and the highest id among them: when it
-- read $4, it stopped short of $5, and the discovery floor may move only as
-- far as it read.
--
-- Each probe is ordered by (topic, id) and limited to one row, rather than an
-- EXISTS: an EXISTS lets the planner bet that a sequential scan finds a row at
-- once, and while something holds the vacuum horizon the outbox's statistics
-- (a few live rows in a table of dead ones) made it take that bet, ten
-- sequential scans of the whole table a sweep (85,000 buffers, 0.2 to 0.45 s;
-- the soak of issue 32). Ordered, a sequential scan must read everything before
-- its first row, so the index wins whatever the statistics say.
--
-- The discovery scan has two halves of up to $4 rows each: the rows read
-- before ($3, $5], read again until the floor may move past them (to find
-- the rows that commit out of id order among them), and the new rows above
-- $5. The sweeper reads them again only when the cursor can use it, about
-- once a second (cursor.go, rereadDue), and otherwise passes $3 = $5. Why two: a single scan from the floor spent its limit on the rows read
-- before, so that after a burst of $4 rows (a flood of topics that each trip
-- at once) a new topic's rows were not even seen until the floor moved, a
-- second or two later (issue 30). Each half is ordered by id and limited so
-- that the planner keeps to the outstanding index even with a generic plan
-- (pgx prepares the statement); a larger burst is discovered over several
-- sweeps, and the known topics' rows in it are read by their own probes
-- meanwhile.
WITH snapshot AS MATERIALIZED (
    SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin,
           pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax
), known AS (
    SELECT k.topic,
           (SELECT o.id FROM {{outbox}} o
            WHERE (o.topic, o.id) > (k.topic, k.after)
              AND (o.topic, o.id) <= (k.topic, 9223372036854775807)
              AND o.dispatched_at IS NULL
            ORDER BY o.topic, o.id
            LIMIT 1) AS first
    FROM unnest($1::text[], $2::bigint[]) AS k(topic, after)
), reread AS MATERIALIZED (
    SELECT o.topic, o.id
    FROM {{outbox}} o
    WHERE o.id > $3 AND o.id <= $5 AND o.dispatched_at IS NULL
    ORDER BY o.id
    LIMIT $4
), fresh AS (
    SELECT f.topic, max(f.id) AS last
    FROM (SELECT topic, id FROM reread
          UNION ALL
          (SELECT o.topic, o.id
           FROM {{outbox}} o
           WHERE o.id > greatest($3::bigint, $5::bigint) AND o.dispatched_at IS NULL
           ORDER BY o.id
           LIMIT $4)) f
    GROUP BY f.topic
)
SELECT 0 AS kind, topic, first IS NOT NULL, first FROM known
UNION ALL
SELECT 1, topic, NULL, last FROM fresh
UNION ALL
SELECT 2, xmin::text, NULL, xmax FROM snapshot
UNION ALL
SELECT 3, count(*)::text, NULL, max(id) FROM reread
