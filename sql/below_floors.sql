-- Whether any outstanding row lies at or below the sweeper's cursor's floors
-- (outbox/cursor.go), where no sweep would read it: a row of a known topic
-- ($1) at or below its floor ($2), or a row of any other topic at or below the
-- discovery floor ($3); $1 may be NULL, for none. Sweeps never put one there; a row copied back by hand
-- with its own id (INSERT … OVERRIDING SYSTEM VALUE), or a writer stalled
-- between drawing its id and starting its transaction for longer than the
-- cursor waits, does. The sweeper runs it in the background once a minute and
-- reads every topic again from its first row only when it says yes.
--
-- It walks the indexes from the lowest ids up to the floors, over every dead
-- entry a held horizon keeps there: that is why it runs beside the sweeps, not
-- in them. Forgetting the floors blindly once a minute, as the cursor did
-- first, made a sweep pay that walk itself, per topic and per page (the soak
-- of issue 32: a 0.9 s claim and a 3 s stall as a held snapshot ended).
SELECT EXISTS (
           SELECT FROM unnest($1::text[], $2::bigint[]) AS k(topic, after)
           WHERE EXISTS (SELECT FROM {{outbox}} o
                         WHERE (o.topic, o.id) >= (k.topic, -9223372036854775808)
                           AND (o.topic, o.id) <= (k.topic, k.after)
                           AND o.dispatched_at IS NULL))
    OR EXISTS (SELECT FROM {{outbox}} o
               WHERE o.id <= $3
                 AND o.dispatched_at IS NULL
                 AND o.topic <> ALL (coalesce($1::text[], '{}')))
