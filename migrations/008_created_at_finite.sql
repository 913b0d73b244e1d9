-- A row's created_at must be a finite time. Postgres takes 'infinity' and
-- '-infinity' for a timestamptz, and a row written with either can never be
-- sent as it is: it has no age to expire by, and no time to give the broker.
-- The sweeper reads such a row and dead-letters it with reason unreadable_row
-- (rows written before this migration, or with the constraint dropped); this
-- refuses new ones at write time, in the application's transaction, where the
-- mistake is made and can be fixed.
--
-- NOT VALID: the constraint holds for every row written from now on, and the
-- rows already there are not read. Adding it takes the table's lock for a
-- moment (no scan), so it neither waits on a large table nor fails on an old
-- row. Once no such row is left (SELECT count(*) FROM the outbox WHERE NOT
-- isfinite(created_at)), an operator may run ALTER TABLE … VALIDATE CONSTRAINT
-- {{.prefix}}_created_at_finite, which reads the table without blocking writes
-- (README, "Upgrading to migration 8").
--
-- expires_at needs no such rule: 'infinity' is no deadline, '-infinity' one
-- long past, and the sweeper reads both. The dead-letter table has none
-- either: the rows that move there keep what they held.
SET LOCAL lock_timeout = '10s';

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_constraint
                   WHERE conrelid = to_regclass('{{.outbox}}') AND conname = '{{.prefix}}_created_at_finite') THEN
        ALTER TABLE {{.outbox}} ADD CONSTRAINT {{.prefix}}_created_at_finite CHECK (isfinite(created_at)) NOT VALID;
    END IF;
END
$$;

---- create above / drop below ----

ALTER TABLE {{.outbox}} DROP CONSTRAINT IF EXISTS {{.prefix}}_created_at_finite;
