-- Autovacuum settings for the outbox. Every message is an insert, a mark (an
-- update that is never HOT: dispatched_at is in the partial indexes'
-- predicates) and a retention delete, so the table turns over its whole size
-- each retention period. Postgres's defaults vacuum a table once a fifth of
-- it is dead (autovacuum_vacuum_scale_factor 0.2): for an outbox that keeps a
-- week of dispatched rows that is over a day's traffic of dead versions, all
-- of which the sweeps' index scans step over until vacuum removes them. At a
-- hundredth, with a floor of 1,000 rows for small tables, vacuum keeps pace
-- without running all the time on a large one (each run also reads the
-- table's indexes whole). Analyze follows the same turnover, so that the
-- planner's statistics never predate a drain (claim_page.sql).
--
-- Nothing here blocks the application: setting these takes a lock that
-- conflicts only with other schema changes and vacuum itself. An operator may
-- change them later with ALTER TABLE … SET (…); a later migrate does not
-- touch them again. README, "The outbox table", says what was set and how to undo it.
SET LOCAL lock_timeout = '10s';

ALTER TABLE {{.outbox}} SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.01,
    autovacuum_analyze_threshold = 1000
);

---- create above / drop below ----

ALTER TABLE {{.outbox}} RESET (
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_threshold,
    autovacuum_vacuum_insert_scale_factor,
    autovacuum_analyze_scale_factor,
    autovacuum_analyze_threshold
);
