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
		pgx.Identifier{tbl.Schema, tbl.Name + "_schema_version"}.Sanitize()))
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
