package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer/memory"
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
		// Refused here, naming the message, rather than by the server, which
		// aborts the transaction naming none; or silently changed.
		"topic not UTF-8":   {outbox.Message{Topic: "a\xff"}, `message 2 of 2: topic "a\xff" is not valid UTF-8`},
		"corr not UTF-8":    {outbox.Message{Topic: "a", CorrelationID: "\xfe"}, `correlation id "\xfe" is not valid UTF-8`},
		"header key merged": {outbox.Message{Topic: "a", Headers: map[string]any{"\xff": "one", "\xfe": "two"}}, `headers key "\x`},
		"header value":      {outbox.Message{Topic: "a", Headers: map[string]any{"k": []any{"ok", "a\xffb"}}}, `headers["k"][1] of topic "a" is not valid UTF-8`},
		"headers too deep":  {outbox.Message{Topic: "a", Headers: map[string]any{"k": deepHeaders(10_001)}}, `nest deeper than the 10,000 levels`},
		"expires too late":  {outbox.Message{Topic: "a", ExpiresAt: time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)}, `outside the years -4712 to 294275`},
	} {
		t.Run(name, func(t *testing.T) {
			err := w.Write(context.Background(), dbtest.Pool(t), outbox.Message{Topic: "ok"}, tc.msg)
			require.ErrorContains(t, err, tc.want)
			require.Empty(t, readRows(t, tbl), "a rejected call writes nothing")
		})
	}
}

// deepHeaders nests n levels of JSON arrays.
func deepHeaders(n int) any {
	var v any = "leaf"
	for range n - 1 {
		v = []any{v}
	}
	return v
}

// WriteOrdered checks every message before it locks a topic: a refused call
// leaves the transaction holding nothing, and other writers of the topic
// never wait on it.
func TestWriteOrderedChecksBeforeLocking(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	ctx := context.Background()
	tx, err := dbtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	err = w.WriteOrdered(ctx, tx, outbox.Message{Topic: "orders"}, outbox.Message{Topic: "orders", MessageID: "42"})
	require.ErrorContains(t, err, `message id "42" is not a UUID`)
	var locks int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").Scan(&locks))
	require.Zero(t, locks, "no topic lock taken")
	require.NoError(t, w.WriteOrdered(ctx, tx, outbox.Message{Topic: "orders"}), "the transaction is untouched")
}

func TestNewWriterRejectsBadTableNames(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewWriter(outbox.Table{Name: "Outbox; DROP TABLE x"})
	require.ErrorContains(t, err, `table (--table) is "Outbox; DROP TABLE x": not a valid name`)
	_, err = outbox.NewWriter(outbox.Table{Schema: "1abc"})
	require.ErrorContains(t, err, `schema (--schema) is "1abc": not a valid name`)
}

// Two transactions write one topic at once; the first to insert commits last.
// With Write, the row with the higher id is committed, and sent, first: the
// topic arrives out of order. With WriteOrdered the second waits for the first,
// draws the higher id, and the topic arrives in commit order.
func TestWriteOrderedDeliversConcurrentWritersInCommitOrder(t *testing.T) {
	t.Parallel()
	for _, ordered := range []bool{false, true} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			ctx := context.Background()
			pool := dbtest.Pool(t)
			w, err := outbox.NewWriter(tbl)
			require.NoError(t, err)
			write := func(tx pgx.Tx, payload string) error {
				m := outbox.Message{Topic: "orders", Payload: []byte(payload)}
				if ordered {
					return w.WriteOrdered(ctx, tx, m)
				}
				return w.Write(ctx, tx, m)
			}
			prod := memory.New(memory.Config{})
			stop := dbtest.RunSweeper(t, newSweeper(t, dbtest.NewPool(t, 6), prod, outbox.Config{Table: tbl, Tick: 5 * time.Millisecond}))
			defer stop()

			// The slow transaction writes first and commits last.
			slow, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer slow.Rollback(ctx)
			require.NoError(t, write(slow, "first"))

			fastPID, fastDone := writeInBackground(t, pool, func(tx pgx.Tx) error { return write(tx, "second") })
			if ordered {
				waitBlockedBy(t, backendPID(t, slow), fastPID, fastDone, "WriteOrdered waiting for the transaction holding the topic")
			} else {
				select {
				case err := <-fastDone:
					require.NoError(t, err)
				case <-time.After(patience):
					t.Fatal("Write waited for another transaction")
				}
				dbtest.Eventually(t, patience, "the second row sent", func() bool { return len(prod.Messages()) == 1 })
			}
			require.NoError(t, slow.Commit(ctx))
			if ordered {
				require.NoError(t, <-fastDone)
			}
			dbtest.Eventually(t, patience, "both rows sent", func() bool { return len(prod.Messages()) == 2 })

			var got []string
			for _, m := range prod.Messages() {
				got = append(got, string(m.Payload))
			}
			if ordered {
				require.Equal(t, []string{"first", "second"}, got, "commit order")
			} else {
				require.Equal(t, []string{"second", "first"}, got, "with Write, the later commit with the lower id arrives last")
			}
		})
	}
}

func TestWriteOrderedRejectsAnEmptyTopicBeforeLocking(t *testing.T) {
	t.Parallel()
	w, err := outbox.NewWriter(dbtest.Table(t))
	require.NoError(t, err)
	ctx := context.Background()
	tx, err := dbtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	err = w.WriteOrdered(ctx, tx, outbox.Message{Topic: "a"}, outbox.Message{Topic: ""})
	require.ErrorContains(t, err, "outbox message 2 of 2: topic is empty")
}

// The SQL for other languages (docs/writing.md, "From any language") takes
// the lock WriteOrdered takes: a
// transaction holding it makes WriteOrdered wait.
func TestWriteOrderedTakesTheLockOfTheSQLExample(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	other, err := dbtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer other.Rollback(ctx)
	_, err = other.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended('outbox-writer "+tbl.String()+" orders.paid', 0))")
	require.NoError(t, err)

	pid, done := writeInBackground(t, dbtest.Pool(t), func(tx pgx.Tx) error {
		return w.WriteOrdered(ctx, tx, outbox.Message{Topic: "orders.paid"})
	})
	waitBlockedBy(t, backendPID(t, other), pid, done, "WriteOrdered waiting for the SQL example's lock")
	require.NoError(t, other.Rollback(ctx))
	require.NoError(t, <-done)
}

// backendPID returns the id of the server process of a connection or
// transaction.
func backendPID(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int32 {
	t.Helper()
	var pid int32
	require.NoError(t, q.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
	return pid
}

// writeInBackground runs write in a transaction of its own on a connection of
// its own, in the background. It returns that connection's backend pid, and a
// channel that gets the transaction's outcome.
func writeInBackground(t *testing.T, pool *pgxpool.Pool, write func(pgx.Tx) error) (int32, <-chan error) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	pid := backendPID(t, conn)
	done := make(chan error, 1)
	go func() {
		defer conn.Release()
		done <- pgx.BeginFunc(ctx, conn, write)
	}()
	return pid, done
}

// waitBlockedBy waits until the session waiter waits for a lock that the
// session holder holds, as Postgres reports it; it fails t if done, the
// waiter's outcome, comes first: then the waiter did not wait.
func waitBlockedBy(t *testing.T, holder, waiter int32, done <-chan error, what string) {
	t.Helper()
	dbtest.Eventually(t, patience, what, func() bool {
		select {
		case err := <-done:
			t.Fatalf("%s: it returned without waiting (%v)", what, err)
		default:
		}
		var blocked bool
		require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(),
			"SELECT $1::int = ANY(pg_blocking_pids($2))", holder, waiter).Scan(&blocked))
		return blocked
	})
}

// Every path of Write (one message, a multi-row insert, COPY; with and without
// a deadline) keeps every column in each of pgx's query modes: exec and
// simple_protocol are what PgBouncer's transaction mode asks for, and in them
// a one-message write once sent its headers as bytea, and failed.
func TestWriteWorksInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			cfg, err := pgxpool.ParseConfig(dbtest.URL(t))
			require.NoError(t, err)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			cfg.MaxConns = 2
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			w, err := outbox.NewWriter(tbl)
			require.NoError(t, err)
			msg := func(i int, expires bool) outbox.Message {
				m := outbox.Message{Topic: "t", Payload: []byte{0, byte(i), 0xff}, Headers: map[string]any{"n": i},
					ContentType: "application/octet-stream", CorrelationID: fmt.Sprint("c-", i), PartitionKey: "k"}
				if expires {
					m.ExpiresAt = time.Now().Add(time.Hour)
				}
				return m
			}
			var want int
			for _, n := range []int{1, 3, outbox.CopyThresholdDefault} {
				for _, expires := range []bool{false, true} {
					msgs := make([]outbox.Message, n)
					for i := range msgs {
						msgs[i] = msg(want+i, expires)
					}
					ctx := context.Background()
					require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) }),
						"%d messages, expiring %v", n, expires)
					want += n
				}
			}
			rows := readRows(t, tbl)
			require.Len(t, rows, want)
			for i, r := range rows {
				require.Equal(t, []byte{0, byte(i), 0xff}, r.Payload)
				require.Equal(t, map[string]any{"n": float64(i)}, r.Headers)
				require.Equal(t, fmt.Sprint("c-", i), *r.Correlation)
			}
		})
	}
}
