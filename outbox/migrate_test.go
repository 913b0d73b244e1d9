package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// Migration 4 creates a trigger, which needs the outbox free of running batch
// transactions. Held longer than the migration waits, it fails saying what to
// do, changes nothing, and succeeds when run again.
func TestMigrationWaitingForALockedOutboxFailsWithWhatToDo(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t) // migrated to the newest version
	ctx := context.Background()
	pool := dbtest.Pool(t)
	ident := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	// Back to version 3, as before an upgrade.
	_, err := pool.Exec(ctx, fmt.Sprintf(`DROP TRIGGER %s ON %s; DROP FUNCTION %s; UPDATE %s SET version = 3`,
		pgx.Identifier{tbl.Name + "_notify"}.Sanitize(), ident,
		pgx.Identifier{tbl.Schema, tbl.Name + "_notify"}.Sanitize(),
		outbox.VersionIdent(tbl)))
	require.NoError(t, err)

	// A sweeper's batch in flight, as far as the lock goes.
	batch, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer batch.Rollback(ctx)
	_, err = batch.Exec(ctx, "LOCK TABLE "+ident+" IN ROW EXCLUSIVE MODE")
	require.NoError(t, err)

	conn, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	start := time.Now()
	_, err = outbox.Migrate(ctx, conn, tbl)
	require.Error(t, err)
	require.Less(t, time.Since(start), 30*time.Second)
	require.Contains(t, err.Error(), "stayed locked")
	require.Contains(t, err.Error(), "run migrate again")
	v, err := outbox.CurrentSchemaVersion(ctx, pool, tbl)
	require.NoError(t, err)
	require.Equal(t, int32(3), v, "nothing changed")

	require.NoError(t, batch.Rollback(ctx))
	res, err := outbox.Migrate(ctx, conn, tbl)
	require.NoError(t, err)
	require.Equal(t, outbox.SchemaVersion(), res.To)
}

// catalog describes what a schema holds, in a form two schemas built the
// same way compare equal in: tables and columns, constraints, indexes,
// triggers, functions, and the recorded version.
func catalog(t *testing.T, schema string) []string {
	t.Helper()
	rows, err := dbtest.Pool(t).Query(context.Background(), `
		SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
		       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE n.nspname = $1 AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
		UNION ALL
		SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint WHERE connamespace = $1::regnamespace
		UNION ALL
		SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = $1
		UNION ALL
		SELECT 'trigger ' || pg_get_triggerdef(tg.oid) FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
		WHERE c.relnamespace = $1::regnamespace AND NOT tg.tgisinternal
		UNION ALL
		SELECT 'function ' || pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = $1::regnamespace
		ORDER BY 1`, schema)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, out)
	return out
}

// The script `sweeper migrate print` writes, run by another tool (here, as one
// simple-protocol Exec, as psql -f would), builds the same schema as Migrate
// and records the version, so the sweeper finds it migrated; and the script
// from a version upgrades a table that is at it.
func TestMigrationScriptBuildsWhatMigrateBuilds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	tbl := outbox.Table{Schema: dbtest.Schema(t), Name: "events"}

	script, err := outbox.MigrationScript(tbl, 0, true)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, script)
	require.NoError(t, err)
	byScript := catalog(t, tbl.Schema)
	st, err := outbox.CheckMigrations(ctx, pool, tbl)
	require.NoError(t, err)
	require.Equal(t, outbox.MigrationStatus{Current: outbox.SchemaVersion(), Latest: outbox.SchemaVersion(), Pending: []outbox.Migration{}}, st)

	conn, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	res, err := outbox.Migrate(ctx, conn, tbl)
	require.NoError(t, err)
	require.Empty(t, res.Applied, "Migrate finds the scripted schema current")

	_, err = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{tbl.Schema}.Sanitize()+" CASCADE")
	require.NoError(t, err)
	res, err = outbox.Migrate(ctx, conn, tbl)
	require.NoError(t, err)
	require.Len(t, res.Applied, int(outbox.SchemaVersion()))
	require.Equal(t, byScript, catalog(t, tbl.Schema), "the script and Migrate build the same schema")

	// An upgrade: a table at version 4 (steps 1-4 run by hand, without
	// BEGIN/COMMIT as goose would run them), then the script from 4.
	_, err = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{tbl.Schema}.Sanitize()+" CASCADE")
	require.NoError(t, err)
	steps, err := outbox.Migrations(tbl)
	require.NoError(t, err)
	require.Len(t, steps, int(outbox.SchemaVersion()))
	require.Equal(t, "001_create_outbox.sql", steps[0].Name)
	head, err := outbox.MigrationScript(tbl, 0, false)
	require.NoError(t, err)
	require.NotContains(t, head, "BEGIN;")
	_, err = pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{tbl.Schema}.Sanitize())
	require.NoError(t, err)
	version := outbox.VersionIdent(tbl)
	_, err = pool.Exec(ctx, "CREATE TABLE "+version+" (version int4 NOT NULL); INSERT INTO "+version+" VALUES (0)")
	require.NoError(t, err)
	for _, s := range steps[:4] {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, s.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, fmt.Sprintf("UPDATE %s SET version = %d", version, s.Version))
			return err
		}), s.Name)
	}
	st, err = outbox.CheckMigrations(ctx, pool, tbl)
	require.NoError(t, err)
	require.Equal(t, int32(4), st.Current)
	require.Equal(t, steps[4:], st.Pending)

	upgrade, err := outbox.MigrationScript(tbl, 4, true)
	require.NoError(t, err)
	require.NotContains(t, upgrade, "001_create_outbox.sql")
	_, err = pool.Exec(ctx, upgrade)
	require.NoError(t, err)
	require.Equal(t, byScript, catalog(t, tbl.Schema), "upgraded by script like a fresh Migrate")

	_, err = outbox.MigrationScript(tbl, outbox.SchemaVersion()+1, true)
	require.ErrorContains(t, err, "the schema has versions 0 to")
	_, err = outbox.MigrationScript(outbox.Table{Name: "Bad"}, 0, true)
	require.ErrorContains(t, err, "not a valid name")
}

// A table a newer sweeper migrated is left as it is, without an error: the
// older binary's migrate step (an init container) ran at a rollback and
// failed on tern's "outside the valid versions", and no pod started.
func TestMigrateLeavesANewerSchemaAsItIs(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	newer := outbox.SchemaVersion() + 1
	_, err := dbtest.Pool(t).Exec(ctx, fmt.Sprintf("UPDATE %s SET version = %d", outbox.VersionIdent(tbl), newer))
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	res, err := outbox.Migrate(ctx, conn, tbl)
	require.NoError(t, err)
	require.True(t, res.Newer)
	require.Empty(t, res.Applied)
	require.Equal(t, newer, res.From)
	require.Equal(t, newer, res.To)
	st, err := outbox.CheckMigrations(ctx, conn, tbl)
	require.NoError(t, err)
	require.Equal(t, newer, st.Current)
	require.Empty(t, st.Pending)
	v, err := outbox.CurrentSchemaVersion(ctx, conn, tbl)
	require.NoError(t, err)
	require.Equal(t, newer, v, "nothing changed")
}

// A role that owns its schema, with no right to create schemas in the
// database (a DBA made the tenants' schemas), migrates its outbox: the
// schema was created IF NOT EXISTS, which Postgres refuses without CREATE
// on the database even when the schema is there.
func TestMigrateInASchemaTheRoleOwnsWithoutCreateOnTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := dbtest.Schema(t) // dropped at cleanup
	role := schema + "_owner"
	pool := dbtest.Pool(t)
	_, err := pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
		_, _ = pool.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{role}.Sanitize())
	})
	_, err = pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+" AUTHORIZATION "+pgx.Identifier{role}.Sanitize())
	require.NoError(t, err)

	cfg, err := pgx.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	cfg.User = role
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var canCreate bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT has_database_privilege(current_database(), 'CREATE')").Scan(&canCreate))
	require.False(t, canCreate, "the role must not create schemas for this test to mean anything")
	res, err := outbox.Migrate(ctx, conn, outbox.Table{Schema: schema, Name: "outbox"})
	require.NoError(t, err)
	require.Equal(t, outbox.SchemaVersion(), res.To)
}
