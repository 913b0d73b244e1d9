package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
)

func TestWriteOneMessageKeepsEveryColumn(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, outbox.Message{
		Topic:         "orders.paid",
		Payload:       []byte{0, 1, 2, 0xff},
		MessageID:     "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22",
		Headers:       map[string]any{"tenant": "acme", "version": 2},
		ContentType:   "application/octet-stream",
		CorrelationID: "req-1",
		PartitionKey:  "order-42",
	})
	rows := readRows(t, tbl)
	require.Len(t, rows, 1)
	r := rows[0]
	require.Equal(t, "orders.paid", r.Topic)
	require.Equal(t, []byte{0, 1, 2, 0xff}, r.Payload)
	require.Equal(t, "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22", r.MessageID)
	require.Equal(t, map[string]any{"tenant": "acme", "version": float64(2)}, r.Headers)
	require.Equal(t, "application/octet-stream", *r.ContentType)
	require.Equal(t, "req-1", *r.Correlation)
	require.Equal(t, "order-42", *r.PartitionKey)
	require.False(t, r.Dispatched)
	require.Zero(t, r.Attempts)
}

func TestWriteDefaultsOptionalColumns(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, outbox.Message{Topic: "a"}) // nil payload is an empty body
	r := readRows(t, tbl)[0]
	require.Equal(t, []byte{}, r.Payload)
	require.Len(t, r.MessageID, 36, "the database generates a message id")
	require.Empty(t, r.Headers)
	require.Nil(t, r.ContentType)
	require.Nil(t, r.Correlation)
	require.Nil(t, r.PartitionKey)
}

// Each size takes a different statement: one row, the unnest INSERT, and COPY.
func TestWriteManyKeepsOrderInOneRoundTrip(t *testing.T) {
	t.Parallel()
	for _, n := range []int{4, outbox.CopyThresholdDefault - 1, outbox.CopyThresholdDefault + 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			msgs := topicMessages("t", n)
			msgs[0].MessageID = "00000000-0000-4000-8000-000000000001"
			msgs[1].Headers = map[string]any{"k": "v"}
			msgs[1].PartitionKey = "p"

			// A pooled connection counts the statements sent: many messages must be
			// one Exec (or one COPY), whatever their number.
			conn, err := dbtest.Pool(t).Acquire(context.Background())
			require.NoError(t, err)
			defer conn.Release()
			counter := &countingDB{DBTX: conn}
			w, err := outbox.NewWriter(tbl)
			require.NoError(t, err)
			require.NoError(t, w.Write(context.Background(), counter, msgs...))
			require.Equal(t, 1, counter.calls)

			rows := readRows(t, tbl)
			require.Len(t, rows, n)
			for i, r := range rows {
				require.Equal(t, fmt.Sprintf("t-%d", i), string(r.Payload), "row %d out of order", i)
				if i > 0 {
					require.Greater(t, r.ID, rows[i-1].ID)
				}
			}
			require.Equal(t, "00000000-0000-4000-8000-000000000001", rows[0].MessageID)
			require.Equal(t, map[string]any{"k": "v"}, rows[1].Headers)
			require.Equal(t, "p", *rows[1].PartitionKey)
			require.Len(t, rows[2].MessageID, 36)
			require.NotEqual(t, rows[2].MessageID, rows[3].MessageID)
		})
	}
}

type countingDB struct {
	outbox.DBTX
	calls int
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.calls++
	return c.DBTX.Exec(ctx, sql, args...)
}

func (c *countingDB) CopyFrom(ctx context.Context, name pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	c.calls++
	return c.DBTX.CopyFrom(ctx, name, cols, src)
}

func TestWriteRollsBackWithTheCallersTransaction(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	ctx := context.Background()
	tx, err := dbtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, tx, topicMessages("a", 3)...))
	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, readRows(t, tbl))
}

func TestWriteRejectsBadMessagesBeforeSendingAnything(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		msg  outbox.Message
		want string
	}{
		"empty topic":     {outbox.Message{Payload: []byte("x")}, "message 2 of 2: topic is empty"},
		"bad message id":  {outbox.Message{Topic: "a", MessageID: "42"}, `message id "42" is not a UUID`},
		"unencodable hdr": {outbox.Message{Topic: "a", Headers: map[string]any{"f": func() {}}}, `headers of topic "a" cannot be encoded`},
	} {
		t.Run(name, func(t *testing.T) {
			err := w.Write(context.Background(), dbtest.Pool(t), outbox.Message{Topic: "ok"}, tc.msg)
			require.ErrorContains(t, err, tc.want)
			require.Empty(t, readRows(t, tbl), "a rejected call writes nothing")
		})
	}
}

func TestNewWriterRejectsBadTableNames(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewWriter(outbox.Table{Name: "Outbox; DROP TABLE x"})
	require.ErrorContains(t, err, `table (--table) is "Outbox; DROP TABLE x": not a valid name`)
	_, err = outbox.NewWriter(outbox.Table{Schema: "1abc"})
	require.ErrorContains(t, err, `schema (--schema) is "1abc": not a valid name`)
}
