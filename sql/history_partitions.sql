-- Lists the partitions of the history table ($1, its quoted name): each one's
-- bare name, its bounds (NULL for the DEFAULT partition, which is_default
-- marks, or for bounds the sweeper did not write: MINVALUE, MAXVALUE), and the
-- database's clock, which the partitions are planned by (the moves stamp rows
-- with it). The bounds are read back from the catalog's text form, which the
-- caller has printed in DateStyle ISO and TimeZone UTC (SET LOCAL): another
-- DateStyle prints zone abbreviations, which the casts may read as another
-- zone's.
SELECT c.relname::text,
       pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' AS is_default,
       b.m[1]::timestamptz AS lower,
       b.m[2]::timestamptz AS upper,
       clock_timestamp() AS now
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL (
    SELECT regexp_match(pg_get_expr(c.relpartbound, c.oid), $re$FROM \('([^']+)'\) TO \('([^']+)'\)$re$) AS m
) b
WHERE i.inhparent = $1::text::regclass
ORDER BY lower NULLS FIRST
