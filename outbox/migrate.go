package outbox

import (
	"context"
	"errors"
	"fmt"

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

	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{t.Schema}.Sanitize()); err != nil {
		return MigrateResult{}, fmt.Errorf("create schema %q: %w", t.Schema, err)
	}

	m, err := migrate.NewMigrator(ctx, conn, versionTable(t))
	if err != nil {
		return MigrateResult{}, fmt.Errorf("prepare version table %s: %w", versionTable(t), err)
	}
	m.Data = map[string]any{
		"outbox":      t.Ident(),
		"dead_letter": t.DeadLetterIdent(),
		"prefix":      t.Name,
		"schema":      pgx.Identifier{t.Schema}.Sanitize(),
		"probe":       probeIdent(t),
		"awake_key":   awakeKey(t),
	}
	if err := m.LoadMigrations(migrations.FS); err != nil {
		return MigrateResult{}, fmt.Errorf("load embedded migrations: %w", err)
	}

	var res MigrateResult
	if res.From, err = m.GetCurrentVersion(ctx); err != nil {
		return res, fmt.Errorf("read schema version from %s: %w", versionTable(t), err)
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
	err = db.QueryRow(ctx, "SELECT version FROM "+pgx.Identifier{t.Schema, t.Name + "_schema_version"}.Sanitize()).Scan(&v)
	return v, err
}
