-- The outbox table's health, for GET /status and the metrics: its size with
-- indexes and TOAST, its live and dead row versions (the statistics
-- collector's estimates), when autovacuum last ran on it, and what holds the
-- vacuum horizon back the longest: the session, replication slot or prepared
-- transaction with the oldest xmin. While something holds it, no row version
-- that any transaction has deleted since (a move to history, a legacy retention
-- delete) can be
-- removed, and the table and its indexes grow (docs/operations.md, "Runbook").
--
--   $1  the outbox table's quoted, schema-qualified name
--
-- A session of another role shows its xmin but not its times unless the
-- sweeper's role has pg_read_all_stats (or pg_monitor): held_seconds is then
-- NULL.
WITH t AS (
    SELECT $1::text::regclass AS rel
), holder AS (
    SELECT kind, who, state, held_seconds, xmin_age
    FROM (
        SELECT 'session' AS kind,
               pid::text || ' (' || coalesce(nullif(application_name, ''), backend_type, 'unknown') || ')' AS who,
               coalesce(state, backend_type) AS state,
               extract(epoch FROM now() - coalesce(xact_start, backend_start))::float8 AS held_seconds,
               age(backend_xmin)::bigint AS xmin_age
        FROM pg_stat_activity
        WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
        UNION ALL
        SELECT 'replication slot', slot_name::text, CASE WHEN active THEN 'active' ELSE 'inactive' END,
               NULL, greatest(age(xmin), age(catalog_xmin))::bigint
        FROM pg_replication_slots
        WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
        UNION ALL
        SELECT 'prepared transaction', gid, 'prepared',
               extract(epoch FROM now() - prepared)::float8, age(transaction)::bigint
        FROM pg_prepared_xacts
    ) h
    ORDER BY xmin_age DESC NULLS LAST
    LIMIT 1
)
SELECT pg_total_relation_size(t.rel), coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0), s.last_autovacuum,
       h.kind, h.who, h.state, h.held_seconds, h.xmin_age
FROM t
LEFT JOIN pg_stat_user_tables s ON s.relid = t.rel
LEFT JOIN holder h ON true
