package admin_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// FleetBacklogs counts each outbox's outstanding rows and reads its oldest
// row's age; an outbox whose schema was dropped since the fleet listed them
// is left out, and the others are still read (the statement that names the
// dropped table fails as a whole: they are asked again one by one).
func TestFleetBacklogsLeaveOutADroppedTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	two, none, gone := dbtest.Table(t), dbtest.Table(t), dbtest.Table(t)
	w, err := outbox.NewWriter(two)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, pool, outbox.Message{Topic: "a", Payload: []byte("1")}, outbox.Message{Topic: "b", Payload: []byte("2")}))
	_, err = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{gone.Schema}.Sanitize()+" CASCADE")
	require.NoError(t, err)

	var outboxes []admin.FleetOutbox
	for _, tbl := range []outbox.Table{two, gone, none} {
		outboxes = append(outboxes, admin.FleetOutbox{Config: admin.Config{Pool: pool, Table: tbl}})
	}
	got, err := admin.FleetBacklogs(ctx, "outbox", outboxes)
	require.NoError(t, err)
	require.Len(t, got, 2, "the dropped tenant left out, the others read: %v", got)
	require.EqualValues(t, 2, got[two.Schema].Rows)
	require.NotNil(t, got[two.Schema].OldestAgeSeconds)
	require.Zero(t, got[none.Schema].Rows)
	require.Nil(t, got[none.Schema].OldestAgeSeconds)
	_, ok := got[gone.Schema]
	require.False(t, ok)
}
