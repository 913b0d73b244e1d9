-- Undoes the claim's mark on rows of a page that were not sent, or whose send
-- failed ($1), just before the page's transaction commits: they stay
-- outstanding as they were (a failure's attempts and error, record_failure.sql,
-- are kept). The page's transaction holds their locks, so nothing else can have
-- touched them.
UPDATE {{outbox}}
SET dispatched_at = NULL
WHERE id = ANY($1::bigint[])
