package admin_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// A replay that would put a message id into the outbox twice replays nothing
// and answers 409 with what to do, not 500.
func TestReplayOfAMessageIDTheOutboxHoldsIsAConflict(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	var id int64
	var mid string
	require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), "SELECT id, message_id::text FROM "+
		pgx.Identifier{b.tbl.Schema, b.tbl.DeadLetterName()}.Sanitize()+" ORDER BY id LIMIT 1").Scan(&id, &mid))
	w, err := outbox.NewWriter(b.tbl)
	require.NoError(t, err)
	require.NoError(t, w.Write(context.Background(), dbtest.Pool(t), outbox.Message{Topic: "orders", MessageID: mid, Payload: []byte("again")}))

	code, body := b.call(t, "POST", "/dlq/replay", "", `{"all":true}`)
	require.Equal(t, 409, code, "%v", body)
	require.Contains(t, body["error"], mid)
	code, body = b.call(t, "GET", "/dlq", "", "")
	require.Equal(t, 200, code)
	require.Len(t, body["dead_letters"], 3, "nothing replayed")
}
