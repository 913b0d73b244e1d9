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
--   $4  the most rows the discovery scan reads
--
-- It returns one row per known topic (kind 0), saying whether it has an
-- outstanding row above its floor (one probe of the (topic, id) index each);
-- one row per topic with outstanding rows above the discovery floor (kind 1),
-- with the highest id read, read in id order through the outstanding (id)
-- index, up to $4 rows; and one row (kind 2) with the statement's snapshot's
-- xmin and xmax, which the cursor needs to know when rows it could not see
-- have all committed.
--
-- Each probe is ordered by (topic, id) and limited to one row, rather than an
-- EXISTS: an EXISTS lets the planner bet that a sequential scan finds a row at
-- once, and while something holds the vacuum horizon the outbox's statistics
-- (a few live rows in a table of dead ones) made it take that bet, ten
-- sequential scans of the whole table a sweep (85,000 buffers, 0.2 to 0.45 s;
-- the soak of issue 32). Ordered, a sequential scan must read everything before
-- its first row, so the index wins whatever the statistics say.
--
-- The discovery scan is ordered by id and limited so that the planner keeps to
-- the outstanding index even with a generic plan (pgx prepares the statement);
-- a burst larger than $4 is discovered over several sweeps, and the known
-- topics' rows in it are read by their own probes meanwhile.
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
            LIMIT 1) IS NOT NULL AS outstanding
    FROM unnest($1::text[], $2::bigint[]) AS k(topic, after)
), fresh AS (
    SELECT f.topic, max(f.id) AS last
    FROM (SELECT o.topic, o.id
          FROM {{outbox}} o
          WHERE o.id > $3 AND o.dispatched_at IS NULL
          ORDER BY o.id
          LIMIT $4) f
    GROUP BY f.topic
)
SELECT 0 AS kind, topic, outstanding, NULL::bigint AS last FROM known
UNION ALL
SELECT 1, topic, NULL, last FROM fresh
UNION ALL
SELECT 2, xmin::text, NULL, xmax FROM snapshot
