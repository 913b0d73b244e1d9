-- Lists dead letters, newest first. Each filter is NULL to leave it off:
--   $1 ids, $2 topic, $3 reason, $4 dead-lettered at or after, $5 before;
--   $6 the most rows; $7 whether to return payloads and headers;
--   $8, $9 the page's cursor: the (dead_lettered_at, id) of the previous
--   page's last row, whose successors in this order the page starts with.
SELECT id, message_id::text, topic,
       CASE WHEN $7::bool THEN payload END,
       CASE WHEN $7::bool THEN headers END,
       content_type, correlation_id, partition_key, created_at, attempts, last_error,
       reason, error, dead_lettered_at
FROM {{dead_letter}}
WHERE ($1::bigint[] IS NULL OR id = ANY($1::bigint[]))
  AND ($2::text IS NULL OR topic = $2::text)
  AND ($3::text IS NULL OR reason = $3::text)
  AND ($4::timestamptz IS NULL OR dead_lettered_at >= $4::timestamptz)
  AND ($5::timestamptz IS NULL OR dead_lettered_at < $5::timestamptz)
  AND ($8::timestamptz IS NULL OR (dead_lettered_at, id) < ($8::timestamptz, $9::bigint))
ORDER BY dead_lettered_at DESC, id DESC
LIMIT $6
