package dbtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/outbox/writer"
)

// Notifications listens on the outboxes' channel and returns a function that
// counts the notifications naming tbl since its last call: it calls marking
// (if not nil), sends a marker of its own on the channel, committed after
// whatever came before, and reads up to it. Postgres delivers the
// notifications of different transactions in commit order, so everything
// before the marker is in, however slow the server, and nothing after it.
func Notifications(t *testing.T, tbl outbox.Table) func(marking func()) int {
	t.Helper()
	return NotificationsOn(t, URL(t), func(payload string) bool { return payload == tbl.String() })
}

// NotificationsOn is Notifications for the database at url, counting the
// notifications whose payload (the outbox they name) counted accepts. The
// connection lasts as long as tb.
func NotificationsOn(tb testing.TB, url string, counted func(payload string) bool) func(marking func()) int {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = conn.Close(ctx) })
	_, err = conn.Exec(ctx, "LISTEN "+outbox.NotifyChannel)
	require.NoError(tb, err)
	markers := 0
	return func(marking func()) int {
		tb.Helper()
		markers++
		// Its own: other counters, of other tests, send theirs on the
		// same channel.
		marker := fmt.Sprintf("marker %d of the listener %d", markers, conn.PgConn().PID())
		if marking != nil {
			marking()
		}
		// From the listening session itself: it gets its own notifications,
		// in commit order with everyone's.
		_, err := conn.Exec(ctx, "SELECT pg_notify($1, $2)", outbox.NotifyChannel, marker)
		require.NoError(tb, err)
		n := 0
		for {
			waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
			note, err := conn.WaitForNotification(waitCtx)
			cancel()
			require.NoError(tb, err, "waiting for the marker")
			switch {
			case note.Payload == marker:
				return n
			case counted(note.Payload):
				n++
			}
		}
	}
}

// AwakeHolder returns the pid of the session named app (its
// application_name) that holds tbl's awake lock (outbox/awake.go), 0 for
// none: whether a sweeper, or a fleet's LISTEN session, keeps tbl awake, so
// that its commits do not notify.
func AwakeHolder(t *testing.T, tbl outbox.Table, app string) int32 {
	t.Helper()
	var pid int32
	err := Pool(t).QueryRow(context.Background(), `SELECT coalesce(max(l.pid), 0) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.granted AND ((l.classid::bigint << 32) | l.objid::bigint) = $1 AND a.application_name = $2`,
		writer.AdvisoryKey("outbox-sweeper awake "+tbl.String()), app).Scan(&pid)
	require.NoError(t, err)
	return pid
}
