package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/tern/v2/migrate"

	"github.com/outbox-sweeper/sweeper/migrations"

	"github.com/outbox-sweeper/sweeper/outbox/writer"
)

// MigrateResult says what [Migrate] did.
type MigrateResult struct {
	// From and To are the schema versions before and after.
	From, To int32
	// Applied names the migrations applied, in order.
	Applied []string
	// Newer says the table was at a version newer than this binary's
	// (SchemaVersion): a newer sweeper migrated it, and this one, rolled
	// back to, relays it as it is. Nothing was applied.
	Newer bool
}

// Migrate brings the outbox table t and its dead-letter table to the newest
// schema version, creating the schema if needed. It is idempotent, and safe when
// several processes run it at once: they queue on an advisory lock, and the later
// ones find nothing left to do.
//
// It needs a single connection rather than a pool, since the advisory lock and
// the migration transactions must share one session.
func Migrate(ctx context.Context, conn *pgx.Conn, t Table) (MigrateResult, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return MigrateResult{}, err
	}

	// tern serializes migrations with an advisory lock of its own, but only once
	// its version table exists, and that table lives in a schema we may have to
	// create. Two concurrent "CREATE SCHEMA IF NOT EXISTS" can still collide on
	// the catalog's unique index, so this lock, taken first, covers the whole run.
	lock := writer.AdvisoryKey("outbox-sweeper migrate " + t.String())
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lock); err != nil {
		return MigrateResult{}, fmt.Errorf("take migration lock: %w", err)
	}
	defer func() {
		// A failed unlock is harmless: the lock is released when the session ends.
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lock)
	}()

	// Only when missing: CREATE SCHEMA IF NOT EXISTS needs CREATE on the
	// database even when the schema is there, which a role that owns its
	// schema (a DBA made the tenants' schemas) need not have.
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)", t.Schema).Scan(&exists); err != nil {
		return MigrateResult{}, fmt.Errorf("look for schema %q: %w", t.Schema, err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{t.Schema}.Sanitize()); err != nil {
			return MigrateResult{}, fmt.Errorf("create schema %q: %w", t.Schema, err)
		}
	}

	m, err := migrate.NewMigrator(ctx, conn, versionTable(t))
	if err != nil {
		return MigrateResult{}, fmt.Errorf("prepare version table %s: %w", versionTable(t), err)
	}
	if err := load(m, t); err != nil {
		return MigrateResult{}, err
	}

	var res MigrateResult
	if res.From, err = m.GetCurrentVersion(ctx); err != nil {
		return res, fmt.Errorf("read schema version from %s: %w", versionTable(t), err)
	}
	if res.From > SchemaVersion() {
		// A rollback of the binary: its init step (deploy/) ran migrate and
		// failed on tern's "outside the valid versions", and no pod of the
		// older sweeper started, where /readyz takes a newer schema.
		res.To, res.Newer = res.From, true
		return res, nil
	}
	m.OnStart = func(_ int32, name, _, _ string) { res.Applied = append(res.Applied, name) }
	if err := m.Migrate(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P07" {
			return res, fmt.Errorf("migrate %s: a table of that name exists but %s does not record it: %w (move the old table away or pick another --table)", t, versionTable(t), err)
		}
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			return res, fmt.Errorf("migrate %s: the table stayed locked (batches of running sweepers, or a long transaction of the application) longer than the migration waits: %w; "+
				"nothing was changed: run migrate again, or stop the sweepers while it runs", t, err)
		}
		return res, fmt.Errorf("migrate %s: %w", t, err)
	}
	if res.To, err = m.GetCurrentVersion(ctx); err != nil {
		return res, fmt.Errorf("read schema version from %s: %w", versionTable(t), err)
	}
	return res, nil
}

// SchemaVersion returns the newest migration's version, the one [Migrate] brings
// a table to.
func SchemaVersion() int32 {
	names, err := migrate.FindMigrations(migrations.FS)
	if err != nil {
		panic(fmt.Sprintf("embedded migrations are broken: %v", err))
	}
	return int32(len(names))
}

// CurrentSchemaVersion returns the version recorded for t, or 0 when t was never
// migrated.
func CurrentSchemaVersion(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, t Table) (int32, error) {
	t = t.WithDefaults()
	var exists bool
	err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", versionTable(t)).Scan(&exists)
	if err != nil || !exists {
		return 0, err
	}
	var v int32
	err = db.QueryRow(ctx, "SELECT version FROM "+VersionIdent(t)).Scan(&v)
	return v, err
}

// load fills in t's names and loads the embedded migrations into m.
func load(m *migrate.Migrator, t Table) error {
	m.Data = map[string]any{
		"outbox":          t.Ident(),
		"dead_letter":     t.DeadLetterIdent(),
		"history":         HistoryIdent(t),
		"history_default": historyDefaultIdent(t),
		"prefix":          t.Name,
		"schema":          pgx.Identifier{t.Schema}.Sanitize(),
		"probe":           probeIdent(t),
		"awake_key":       awakeKey(t),
	}
	if err := m.LoadMigrations(migrations.FS); err != nil {
		return fmt.Errorf("load embedded migrations: %w", err)
	}
	return nil
}

// Migration is one step of the schema, as [Migrate] runs it on a table.
type Migration struct {
	// Version is the schema version the step brings a table to.
	Version int32
	// Name is the migration's file name, e.g. 005_unique_message_id.sql.
	Name string
	// SQL is the step with the table's names filled in. It expects a
	// transaction (its SET LOCAL statements do).
	SQL string
}

// Migrations returns every step of the schema for table t, oldest first, with
// t's names filled in: what Migrate runs, for a DBA's review or a team's own
// migration tool. It needs no database.
func Migrations(t Table) ([]Migration, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	m, err := migrate.NewMigratorEx(context.Background(), nil, versionTable(t), &migrate.MigratorOptions{})
	if err != nil {
		return nil, err
	}
	if err := load(m, t); err != nil {
		return nil, err
	}
	out := make([]Migration, len(m.Migrations))
	for i, mig := range m.Migrations {
		out[i] = Migration{Version: mig.Sequence, Name: mig.Name, SQL: mig.UpSQL}
	}
	return out, nil
}

// MigrationScript returns the steps of the schema after version from (0: all
// of them) as one plain SQL script for table t: the schema and the version
// table created if missing, then each step followed by the update of the
// version Migrate records, so that a database migrated by another tool is
// one the sweeper recognises (its readiness checks the version). With
// transactions set, each step and its version update are wrapped in
// BEGIN/COMMIT, as Migrate runs them (for psql -f); without, the caller's tool
// must run each step in a transaction of its own (goose, Flyway and Liquibase
// do by default). The version table is named <table>_schema_version.
func MigrationScript(t Table, from int32, transactions bool) (string, error) {
	steps, err := Migrations(t)
	if err != nil {
		return "", err
	}
	t = t.WithDefaults()
	if from < 0 || int(from) > len(steps) {
		return "", fmt.Errorf("from version %d: the schema has versions 0 to %d", from, len(steps))
	}
	version := VersionIdent(t)
	var b strings.Builder
	fmt.Fprintf(&b, "-- The outbox sweeper's schema for %s, versions %d to %d, as `sweeper migrate` applies it.\n", t, from+1, len(steps))
	fmt.Fprintf(&b, "-- Each step ends by recording its version in %s, which the sweeper's readiness checks.\n\n", version)
	if from == 0 {
		fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n", pgx.Identifier{t.Schema}.Sanitize())
		fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS %s (version int4 NOT NULL);\n", version)
		fmt.Fprintf(&b, "INSERT INTO %s (version) SELECT 0 WHERE NOT EXISTS (SELECT FROM %s);\n\n", version, version)
	}
	for _, s := range steps[from:] {
		fmt.Fprintf(&b, "-- Version %d: %s\n", s.Version, s.Name)
		if transactions {
			b.WriteString("BEGIN;\n")
		}
		b.WriteString(strings.TrimSpace(s.SQL))
		fmt.Fprintf(&b, "\n\nUPDATE %s SET version = %d;\n", version, s.Version)
		if transactions {
			b.WriteString("COMMIT;\n")
		}
		b.WriteString("\n")
	}
	return b.String(), nil
}

// MigrationStatus says which schema version a database holds for an outbox
// and what Migrate would apply.
type MigrationStatus struct {
	// Current is the version recorded (0: never migrated); Latest the one
	// Migrate brings a table to.
	Current, Latest int32
	// Pending lists the steps Migrate would apply, oldest first.
	Pending []Migration
}

// CheckMigrations reads t's schema version through db and says what Migrate
// would apply. It changes nothing. A version above the newest this build
// knows (a newer sweeper migrated the table) has nothing pending: Current
// above Latest says so.
func CheckMigrations(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, t Table) (MigrationStatus, error) {
	steps, err := Migrations(t)
	if err != nil {
		return MigrationStatus{}, err
	}
	st := MigrationStatus{Latest: int32(len(steps))}
	if st.Current, err = CurrentSchemaVersion(ctx, db, t); err != nil {
		return st, fmt.Errorf("read the schema version of %s: %w", t.WithDefaults(), err)
	}
	if st.Current > st.Latest {
		return st, nil // a newer sweeper migrated it: nothing to apply
	}
	st.Pending = steps[st.Current:]
	return st, nil
}
