package dbtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/outbox"
)

// Notifications listens on the outboxes' channel and returns a function that
// counts the notifications naming tbl since its last call: it calls marking
// (if not nil), sends a marker of its own on the channel, committed after
// whatever came before, and reads up to it. Postgres delivers the
// notifications of different transactions in commit order, so everything
// before the marker is in, however slow the server, and nothing after it.
func Notifications(t *testing.T, tbl outbox.Table) func(marking func()) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	_, err = conn.Exec(ctx, "LISTEN "+outbox.NotifyChannel)
	require.NoError(t, err)
	markers := 0
	return func(marking func()) int {
		t.Helper()
		markers++
		marker := fmt.Sprintf("marker %d of %s", markers, tbl)
		if marking != nil {
			marking()
		}
		_, err := Pool(t).Exec(ctx, "SELECT pg_notify($1, $2)", outbox.NotifyChannel, marker)
		require.NoError(t, err)
		n := 0
		for {
			waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
			note, err := conn.WaitForNotification(waitCtx)
			cancel()
			require.NoError(t, err, "waiting for the marker")
			switch note.Payload {
			case marker:
				return n
			case tbl.String():
				n++
			}
		}
	}
}
