package writer_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq" // the other database/sql driver for Postgres
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox/writer"
)

// row is an outbox row as the tests read it back.
type row struct {
	ID           int64
	MessageID    string
	Topic        string
	Payload      []byte
	Headers      map[string]any
	ContentType  *string
	Correlation  *string
	PartitionKey *string
}

func readRows(t *testing.T, tbl writer.Table) []row {
	t.Helper()
	rows, err := dbtest.Pool(t).Query(context.Background(), `SELECT id, message_id::text, topic, payload, headers,
		content_type, correlation_id, partition_key FROM `+tbl.Ident()+` ORDER BY id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	return out
}

// sqlDBs opens the test database through both Postgres drivers of
// database/sql: pgx's stdlib and lib/pq.
func sqlDBs(t *testing.T) map[string]*sql.DB {
	t.Helper()
	pq, err := sql.Open("postgres", dbtest.URL(t))
	require.NoError(t, err)
	pq.SetMaxOpenConns(4)
	t.Cleanup(func() { pq.Close() })
	std := stdlib.OpenDBFromPool(dbtest.Pool(t))
	t.Cleanup(func() { std.Close() })
	return map[string]*sql.DB{"pgx-stdlib": std, "lib-pq": pq}
}

// Every column arrives as written, through either driver, in one statement,
// in a *sql.Tx that commits it with the business change or rolls it back.
func TestWriteSQLKeepsEveryColumnThroughEitherDriver(t *testing.T) {
	t.Parallel()
	for name, db := range sqlDBs(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			w, err := writer.New(tbl)
			require.NoError(t, err)
			ctx := context.Background()
			msgs := []writer.Message{
				{Topic: "orders.paid", Payload: []byte{0, 1, 2, 0xff}, MessageID: "6F1C2A0E-8D9B-4B8E-9A51-3F0B7E0C1D22",
					Headers: map[string]any{"tenant": "acme", "version": 2}, ContentType: "application/octet-stream",
					CorrelationID: "req-1", PartitionKey: "order-42"},
				{Topic: "orders.paid"}, // nil payload: an empty body; the id is generated
				{Topic: "ünïcode ✓", Payload: []byte(`{"a":"\u0000"}`), Headers: map[string]any{"quote": `"'\`}},
			}

			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			counter := &countingSQL{SQLDB: tx}
			require.NoError(t, w.WriteSQL(ctx, counter, msgs...))
			require.Equal(t, 1, counter.calls, "one statement for the whole call")
			require.NoError(t, tx.Rollback())
			require.Empty(t, readRows(t, tbl), "rolled back with the business change")

			tx, err = db.BeginTx(ctx, nil)
			require.NoError(t, err)
			require.NoError(t, w.WriteSQL(ctx, tx, msgs...))
			require.NoError(t, tx.Commit())

			rows := readRows(t, tbl)
			require.Len(t, rows, 3)
			r := rows[0]
			require.Equal(t, "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22", r.MessageID)
			require.Equal(t, "orders.paid", r.Topic)
			require.Equal(t, []byte{0, 1, 2, 0xff}, r.Payload)
			require.Equal(t, map[string]any{"tenant": "acme", "version": float64(2)}, r.Headers)
			require.Equal(t, "application/octet-stream", *r.ContentType)
			require.Equal(t, "req-1", *r.Correlation)
			require.Equal(t, "order-42", *r.PartitionKey)
			require.Equal(t, []byte{}, rows[1].Payload)
			require.Len(t, rows[1].MessageID, 36)
			require.Equal(t, byte('7'), rows[1].MessageID[14], "a generated id is time-ordered (UUID v7)")
			require.Empty(t, rows[1].Headers)
			require.Nil(t, rows[1].ContentType)
			require.Nil(t, rows[1].Correlation)
			require.Nil(t, rows[1].PartitionKey)
			require.Equal(t, "ünïcode ✓", rows[2].Topic)
			require.Equal(t, []byte(`{"a":"\u0000"}`), rows[2].Payload)
			require.Equal(t, `"'\`, rows[2].Headers["quote"])
			require.Less(t, rows[0].ID, rows[1].ID)
			require.Less(t, rows[1].ID, rows[2].ID, "ids ascend in the order given")

			// *sql.DB and *sql.Conn serve too (outside a transaction: each
			// call commits on its own).
			conn, err := db.Conn(ctx)
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, w.WriteSQL(ctx, conn, writer.Message{Topic: "c"}))
			require.NoError(t, w.WriteSQL(ctx, db, writer.Message{Topic: "d"}))
			require.Len(t, readRows(t, tbl), 5)
		})
	}
}

// A large call is still one statement, and keeps its order.
func TestWriteSQLManyInOneStatement(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	w, err := writer.New(tbl)
	require.NoError(t, err)
	msgs := make([]writer.Message, 5000)
	for i := range msgs {
		msgs[i] = writer.Message{Topic: "t", Payload: fmt.Appendf(nil, "%d", i)}
	}
	db := sqlDBs(t)["pgx-stdlib"]
	counter := &countingSQL{SQLDB: db}
	require.NoError(t, w.WriteSQL(context.Background(), counter, msgs...))
	require.Equal(t, 1, counter.calls)
	rows := readRows(t, tbl)
	require.Len(t, rows, len(msgs))
	for i, r := range rows {
		require.Equal(t, fmt.Sprint(i), string(r.Payload), "row %d", r.ID)
	}
}

// Bad input fails the call before anything is sent, naming the message; a
// message id the outbox holds is a DuplicateMessageIDError through pgx's
// driver, and the driver's own error through lib/pq.
func TestWriteSQLRefusesBadInputAndDuplicates(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	w, err := writer.New(tbl)
	require.NoError(t, err)
	ctx := context.Background()
	dbs := sqlDBs(t)
	for _, c := range []struct {
		msg  writer.Message
		want string
	}{
		{writer.Message{}, "outbox message 2 of 2: topic is empty"},
		{writer.Message{Topic: "a\xffb"}, `outbox message 2 of 2: topic "a\xffb" is not valid UTF-8`},
		{writer.Message{Topic: "a", CorrelationID: "\xfe"}, "correlation id"},
		{writer.Message{Topic: "a", MessageID: "nope"}, `message id "nope" is not a UUID`},
		{writer.Message{Topic: "a", Headers: map[string]any{"f": func() {}}}, "cannot be encoded as JSON"},
		{writer.Message{Topic: "a\x00b"}, `topic "a\x00b" holds a NUL byte, which Postgres text cannot store`},
		{writer.Message{Topic: "a", PartitionKey: "\x00"}, "partition key"},
		{writer.Message{Topic: "a", Headers: map[string]any{"h": "x\x00"}}, `headers of topic "a" hold a NUL character`},
	} {
		counter := &countingSQL{SQLDB: dbs["pgx-stdlib"]}
		err := w.WriteSQL(ctx, counter, writer.Message{Topic: "ok"}, c.msg)
		require.ErrorContains(t, err, c.want)
		require.Zero(t, counter.calls, "nothing sent")
		// pgx's Write checks the same, but for UTF-8, which it leaves to the
		// database (a SQL_ASCII outbox stores any bytes).
		if !strings.Contains(c.want, "UTF-8") && c.msg.CorrelationID == "" {
			tx, err := dbtest.Pool(t).Begin(ctx)
			require.NoError(t, err)
			require.ErrorContains(t, w.Write(ctx, tx, writer.Message{Topic: "ok"}, c.msg), c.want)
			_, err = tx.Exec(ctx, "SELECT 1")
			require.NoError(t, err, "the transaction is not aborted: nothing was sent")
			require.NoError(t, tx.Rollback(ctx))
		}
	}
	// A header holding a backslash and the letters u0000 is text, not a NUL.
	require.NoError(t, w.WriteSQL(ctx, dbs["pgx-stdlib"], writer.Message{Topic: "h", Headers: map[string]any{"h": `\u0000`}}))
	require.Equal(t, `\u0000`, readRows(t, tbl)[0].Headers["h"])
	_, err = dbtest.Pool(t).Exec(ctx, "DELETE FROM "+tbl.Ident())
	require.NoError(t, err)
	const id = "00000000-0000-4000-8000-000000000001"
	err = w.WriteSQL(ctx, dbs["pgx-stdlib"], writer.Message{Topic: "a", MessageID: id}, writer.Message{Topic: "b", MessageID: id})
	var dup *writer.DuplicateMessageIDError
	require.ErrorAs(t, err, &dup)
	require.Nil(t, dup.Err, "caught before sending")

	require.NoError(t, w.WriteSQL(ctx, dbs["pgx-stdlib"], writer.Message{Topic: "a", MessageID: id}))
	err = w.WriteSQL(ctx, dbs["pgx-stdlib"], writer.Message{Topic: "b"}, writer.Message{Topic: "b", MessageID: id})
	require.ErrorAs(t, err, &dup)
	require.Equal(t, id, dup.MessageID)
	require.Equal(t, []int{2}, dup.Positions)
	err = w.WriteSQL(ctx, dbs["lib-pq"], writer.Message{Topic: "b", MessageID: id})
	require.Error(t, err)
	require.False(t, errors.As(err, &dup), "lib/pq's errors are its own")
	require.ErrorContains(t, err, "duplicate key")
	require.Len(t, readRows(t, tbl), 1)
}

// WriteOrderedSQL serializes writers of a topic: a second transaction waits
// for the first to end and draws its ids after it, so id order is commit
// order.
func TestWriteOrderedSQLMakesIDOrderCommitOrder(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	w, err := writer.New(tbl)
	require.NoError(t, err)
	ctx := context.Background()
	db := sqlDBs(t)["lib-pq"]

	first, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.WriteOrderedSQL(ctx, first, writer.Message{Topic: "orders", Payload: []byte("first")}))

	var wg sync.WaitGroup
	secondErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		secondErr <- func() error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if err := w.WriteOrderedSQL(ctx, tx, writer.Message{Topic: "orders", Payload: []byte("second")}); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}()
	}()
	// The second writer waits on the topic's advisory lock.
	dbtest.Eventually(t, time.Minute, "the second writer waiting on the topic lock", func() bool {
		var n int
		require.NoError(t, dbtest.Pool(t).QueryRow(ctx,
			"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").Scan(&n))
		return n >= 1
	})
	// A write of the first transaction after the second's insert was drawn
	// would have a lower id yet commit later; the lock prevents it.
	require.NoError(t, w.WriteOrderedSQL(ctx, first, writer.Message{Topic: "orders", Payload: []byte("first, again")}))
	require.NoError(t, first.Commit())
	wg.Wait()
	require.NoError(t, <-secondErr)

	var payloads []string
	for _, r := range readRows(t, tbl) {
		payloads = append(payloads, string(r.Payload))
	}
	require.Equal(t, []string{"first", "first, again", "second"}, payloads)
}

type countingSQL struct {
	writer.SQLDB
	calls int
}

func (c *countingSQL) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	c.calls++
	return c.SQLDB.ExecContext(ctx, query, args...)
}
