package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
)

const (
	dupID   = "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22"
	otherID = "00000000-0000-4000-8000-0000000000aa"
)

// Two rows with one message_id cannot both be in the outbox, however they are
// written: one message, a multi-row INSERT, COPY, or plain SQL, and also when
// the first row was marked dispatched in the outbox before the history table
// (such a row stays until retention deletes it).
// Through the Writer the error names the id and says what it means, and
// errors.As still finds Postgres's unique violation; nothing of the refused
// call is written.
func TestTwoRowsWithOneMessageIDCannotBothExist(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		n          int  // messages in the refused call; the last one carries dupID
		dispatched bool // the first row was sent before the second write
	}{
		{name: "one message", n: 1},
		{name: "one message, first row dispatched", n: 1, dispatched: true},
		{name: "multi-row insert", n: 100},
		{name: "copy", n: outbox.CopyThresholdDefault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			ctx := context.Background()
			writeMessages(t, tbl, outbox.Message{Topic: "orders", MessageID: dupID})
			if tc.dispatched {
				_, err := dbtest.Pool(t).Exec(ctx, "UPDATE "+ident(tbl)+" SET dispatched_at = now()")
				require.NoError(t, err)
			}

			msgs := topicMessages("orders", tc.n)
			msgs[tc.n-1].MessageID = dupID
			w, err := outbox.NewWriter(tbl)
			require.NoError(t, err)
			err = pgx.BeginFunc(ctx, dbtest.Pool(t), func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) })

			var dup *outbox.DuplicateMessageIDError
			require.ErrorAs(t, err, &dup)
			require.Equal(t, dupID, dup.MessageID)
			require.Equal(t, []int{tc.n}, dup.Positions)
			require.Equal(t, tbl.String(), dup.Table)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr, "the unique violation is wrapped")
			require.Equal(t, "23505", pgErr.Code)
			require.Equal(t, "outbox_message_id_key", pgErr.ConstraintName)
			require.ErrorContains(t, err, "outbox message id "+dupID)
			require.ErrorContains(t, err, "is already in "+tbl.String())
			require.ErrorContains(t, err, "the application reused an idempotency key")
			require.ErrorContains(t, err, "the transaction it ran in is aborted")
			if tc.n > 1 {
				require.ErrorContains(t, err, fmt.Sprintf("(message %d of %d)", tc.n, tc.n))
			}
			require.Len(t, readRows(t, tbl), 1, "nothing of the refused call was written")
		})
	}

	t.Run("plain SQL", func(t *testing.T) {
		t.Parallel()
		tbl := dbtest.Table(t)
		ctx := context.Background()
		insert := "INSERT INTO " + ident(tbl) + " (message_id, topic, payload) VALUES ($1, 'orders', 'x')"
		_, err := dbtest.Pool(t).Exec(ctx, insert, dupID)
		require.NoError(t, err)
		_, err = dbtest.Pool(t).Exec(ctx, insert, dupID)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "23505", pgErr.Code, "Postgres's unique_violation, as the migration's comment says")
		require.Equal(t, "outbox_message_id_key", pgErr.ConstraintName)

		// The migration's comment offers ON CONFLICT for applications that write a
		// message at most once.
		tag, err := dbtest.Pool(t).Exec(ctx, insert+" ON CONFLICT (message_id) DO NOTHING", dupID)
		require.NoError(t, err)
		require.Zero(t, tag.RowsAffected())
		require.Len(t, readRows(t, tbl), 1)
	})
}

// Two transactions write one message id at once: the second waits for the
// first and fails when it commits. Exactly one row is left.
func TestConcurrentWritesOfOneMessageIDLeaveOneRow(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	first, err := dbtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer first.Rollback(ctx)
	require.NoError(t, w.Write(ctx, first, outbox.Message{Topic: "a", MessageID: dupID}))

	second := make(chan error, 1)
	go func() {
		second <- pgx.BeginFunc(ctx, dbtest.Pool(t), func(tx pgx.Tx) error {
			return w.Write(ctx, tx, outbox.Message{Topic: "b", MessageID: dupID})
		})
	}()
	require.NoError(t, first.Commit(ctx))
	var dup *outbox.DuplicateMessageIDError
	require.ErrorAs(t, <-second, &dup)
	require.Equal(t, dupID, dup.MessageID)
	rows := readRows(t, tbl)
	require.Len(t, rows, 1)
	require.Equal(t, "a", rows[0].Topic)
}

// Two messages of one call with one id are refused before anything is sent,
// naming both, so the caller's transaction stays usable. Ids compare as UUIDs,
// whatever their case.
func TestWriteRefusesTwoMessagesOfOneCallWithOneIDBeforeSending(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	conn, err := dbtest.Pool(t).Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	counter := &countingDB{DBTX: tx}

	msgs := topicMessages("orders", 5)
	msgs[1].MessageID = dupID
	msgs[2].MessageID = otherID
	msgs[3].MessageID = "6F1C2A0E-8D9B-4B8E-9A51-3F0B7E0C1D22"
	err = w.Write(ctx, counter, msgs...)
	var dup *outbox.DuplicateMessageIDError
	require.ErrorAs(t, err, &dup)
	require.Nil(t, dup.Err)
	require.Equal(t, []int{2, 4}, dup.Positions)
	require.EqualError(t, err, "outbox messages 2 and 4 of 5 have the same message id "+dupID+
		": the application reused an idempotency key (wrote one message twice, or gave two messages one id), "+
		"and a broker that de-duplicates would drop the second; nothing was written")
	require.Zero(t, counter.calls, "nothing sent")

	require.NoError(t, w.Write(ctx, tx, msgs[:3]...), "the transaction is still usable")
	require.NoError(t, tx.Commit(ctx))
	require.Len(t, readRows(t, tbl), 3)
}

// Dead letters are outside the outbox's unique index: the application may write
// a dead-lettered message's id again, and the sweeper may dead-letter that row
// too. Replaying a dead letter whose id the outbox holds, or two dead letters
// sharing an id, replays nothing and names the id and what holds it; once the
// outbox row is gone (retention), the replay goes through. No row is lost.
func TestReplayOfAMessageIDTheOutboxHoldsFailsNamingIt(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	// Dead letters 1 (dupID) and 2 (otherID).
	d := deadLetterAll(t, tbl, outbox.Message{Topic: "orders", MessageID: dupID}, outbox.Message{Topic: "orders", MessageID: otherID})
	// The application writes dupID again, as row 3: accepted.
	writeMessages(t, tbl, outbox.Message{Topic: "orders", MessageID: dupID, Payload: []byte("again")})

	_, err := d.Replay(ctx, outbox.DeadLetterFilter{All: true})
	var conflict *outbox.ReplayConflictError
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, dupID, conflict.MessageID)
	require.Equal(t, int64(3), conflict.OutboxID)
	require.Equal(t, []int64{1}, conflict.DeadLetterIDs)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code)
	require.ErrorContains(t, err, "message id "+dupID+" of dead letter 1 is already in "+tbl.String()+", as row 3")
	require.ErrorContains(t, err, "nothing was replayed")
	require.ErrorContains(t, err, "purge the dead letter if row 3 replaces it")
	require.Len(t, readDeadLetters(t, tbl), 2, "every dead letter stays, the one without a conflict too")
	rows := readRows(t, tbl)
	require.Len(t, rows, 1)
	require.Equal(t, "again", string(rows[0].Payload))

	// Retention deletes row 3; the replay then goes through.
	_, err = dbtest.Pool(t).Exec(ctx, "DELETE FROM "+ident(tbl))
	require.NoError(t, err)
	n, err := d.Replay(ctx, outbox.DeadLetterFilter{All: true})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Empty(t, readDeadLetters(t, tbl))
	require.Len(t, readRows(t, tbl), 2)
}

func TestReplayOfTwoDeadLettersSharingAMessageIDFailsNamingBoth(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	// The same id written, dead-lettered, written again and dead-lettered again:
	// the sweeper's move into the dead-letter table never fails on an id.
	deadLetterAll(t, tbl, outbox.Message{Topic: "orders", MessageID: dupID, Payload: []byte("first")})
	d := deadLetterAll(t, tbl, outbox.Message{Topic: "orders", MessageID: dupID, Payload: []byte("second")})
	require.Len(t, readDeadLetters(t, tbl), 2)

	_, err := d.Replay(ctx, outbox.DeadLetterFilter{Topic: "orders"})
	var conflict *outbox.ReplayConflictError
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, []int64{1, 2}, conflict.DeadLetterIDs)
	require.Zero(t, conflict.OutboxID)
	require.ErrorContains(t, err, "dead letters [1 2] share message id "+dupID)
	require.ErrorContains(t, err, "replay one of them and purge the others")
	require.Len(t, readDeadLetters(t, tbl), 2)
	require.Empty(t, readRows(t, tbl))

	n, err := d.Replay(ctx, outbox.DeadLetterFilter{IDs: []int64{2}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	rows := readRows(t, tbl)
	require.Len(t, rows, 1)
	require.Equal(t, "second", string(rows[0].Payload))
	_, err = d.Replay(ctx, outbox.DeadLetterFilter{IDs: []int64{1}})
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, rows[0].ID, conflict.OutboxID, "now the replayed copy holds the id")
}

// Upgrading an outbox whose rows already share message ids: migration 5 fails
// saying how many ids, one of them, and the query that lists them, and changes
// nothing. With the copies removed it goes through.
func TestMigrationRefusesExistingDuplicateMessageIDsSayingHowToFindThem(t *testing.T) {
	t.Parallel()
	tbl := beforeUniqueMessageID(t)
	ctx := context.Background()
	pool := dbtest.Pool(t)
	_, err := pool.Exec(ctx, "INSERT INTO "+ident(tbl)+" (message_id, topic, payload, dispatched_at) VALUES "+
		"($1, 'a', 'x', now()), ($1, 'a', 'x', NULL), ($2, 'b', 'y', NULL), ($2, 'b', 'y', NULL), (gen_random_uuid(), 'c', 'z', NULL)",
		dupID, otherID)
	require.NoError(t, err)

	conn := migrationConn(t)
	_, err = outbox.Migrate(ctx, conn, tbl)
	require.Error(t, err)
	q := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	require.ErrorContains(t, err, "cannot make message_id unique in "+q+": 2 message ids are each held by more than one row ("+otherID+" among them)")
	require.ErrorContains(t, err, "nothing was changed")
	require.ErrorContains(t, err, "SELECT message_id, array_agg(id ORDER BY id) AS ids, array_agg(dispatched_at ORDER BY id) AS dispatched_at FROM "+q+" GROUP BY message_id HAVING count(*) > 1")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code)
	requireVersion(t, tbl, 4)
	require.False(t, messageIDIndexExists(t, tbl))
	require.Len(t, readRows(t, tbl), 5)

	// The query in the error finds them.
	rows, err := pool.Query(ctx, "SELECT message_id::text FROM "+q+" GROUP BY message_id HAVING count(*) > 1 ORDER BY 1")
	require.NoError(t, err)
	shared, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{otherID, dupID}, shared)

	_, err = pool.Exec(ctx, "DELETE FROM "+q+" WHERE id IN (2, 4)")
	require.NoError(t, err)
	res, err := outbox.Migrate(ctx, conn, tbl)
	require.NoError(t, err)
	require.Equal(t, outbox.SchemaVersion(), res.To)
	require.True(t, messageIDIndexExists(t, tbl))
}

// An operator built the index beforehand, as the migration's comment says, so
// that inserts were never blocked: the migration finds it and takes no lock on
// the outbox, so a batch in flight does not hold it up.
func TestMigrationFindsAUniqueIndexBuiltConcurrently(t *testing.T) {
	t.Parallel()
	tbl := beforeUniqueMessageID(t)
	ctx := context.Background()
	_, err := dbtest.Pool(t).Exec(ctx, "CREATE UNIQUE INDEX CONCURRENTLY outbox_message_id_key ON "+ident(tbl)+" (message_id)")
	require.NoError(t, err)

	// The batch holds its lock until version 6 is recorded: a migration that
	// needed the lock for 005 or 006 could only wait its 10s and fail ("stayed
	// locked"), so reaching 6 while the lock is held is what shows they took
	// none. 007 adds a column, which does need the table for a moment: it
	// waits for the batch, and goes on once the batch ends.
	batch := lockedOutbox(t, tbl)
	defer batch.Rollback(ctx)
	type result struct {
		res outbox.MigrateResult
		err error
	}
	done := make(chan result, 1)
	conn := migrationConn(t)
	go func() {
		res, err := outbox.Migrate(ctx, conn, tbl)
		done <- result{res, err}
	}()
	dbtest.Eventually(t, patience, "version 6 recorded while the batch holds its lock", func() bool {
		v, err := outbox.CurrentSchemaVersion(ctx, dbtest.Pool(t), tbl)
		return err == nil && v == 6
	})
	require.NoError(t, batch.Rollback(ctx))
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, []string{"005_unique_message_id.sql", "006_notify_only_when_asleep.sql", "007_expires_at.sql",
		"008_created_at_finite.sql", "009_autovacuum.sql", "010_history.sql"}, r.res.Applied)
	requireVersion(t, tbl, outbox.SchemaVersion())
}

// A concurrent build that failed on duplicates leaves an invalid index of the
// name behind. The migration refuses it, saying how to drop it, rather than
// take it for the real one.
func TestMigrationRefusesAnInvalidIndexLeftByAFailedConcurrentBuild(t *testing.T) {
	t.Parallel()
	tbl := beforeUniqueMessageID(t)
	ctx := context.Background()
	pool := dbtest.Pool(t)
	_, err := pool.Exec(ctx, "INSERT INTO "+ident(tbl)+" (message_id, topic, payload) VALUES ($1, 'a', 'x'), ($1, 'a', 'x')", dupID)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "CREATE UNIQUE INDEX CONCURRENTLY outbox_message_id_key ON "+ident(tbl)+" (message_id)")
	require.Error(t, err, "the duplicates fail the build")
	require.True(t, messageIDIndexExists(t, tbl), "and leave an invalid index behind")
	_, err = pool.Exec(ctx, "DELETE FROM "+ident(tbl)+" WHERE id = 2")
	require.NoError(t, err)

	conn := migrationConn(t)
	_, err = outbox.Migrate(ctx, conn, tbl)
	require.ErrorContains(t, err, "is not a valid unique index on "+ident(tbl)+" (message_id)")
	require.ErrorContains(t, err, "drop it with DROP INDEX CONCURRENTLY "+pgx.Identifier{tbl.Schema}.Sanitize()+".outbox_message_id_key")
	requireVersion(t, tbl, 4)

	_, err = pool.Exec(ctx, "DROP INDEX CONCURRENTLY "+pgx.Identifier{tbl.Schema, "outbox_message_id_key"}.Sanitize())
	require.NoError(t, err)
	_, err = outbox.Migrate(ctx, conn, tbl)
	require.NoError(t, err)
	requireVersion(t, tbl, outbox.SchemaVersion())
	_, err = pool.Exec(ctx, "INSERT INTO "+ident(tbl)+" (message_id, topic, payload) VALUES ($1, 'a', 'x')", dupID)
	require.ErrorContains(t, err, "outbox_message_id_key", "the index built by the migration enforces")
}

// Building the index needs the outbox free of running batch transactions. Held
// longer than the migration waits (10s), it fails saying what to do and
// changes nothing.
func TestMigrationBuildingTheIndexWaitsForALockedOutboxAtMost10s(t *testing.T) {
	t.Parallel()
	tbl := beforeUniqueMessageID(t)
	ctx := context.Background()
	batch := lockedOutbox(t, tbl)
	defer batch.Rollback(ctx)
	conn := migrationConn(t)
	start := time.Now()
	_, err := outbox.Migrate(ctx, conn, tbl)
	require.ErrorContains(t, err, "stayed locked")
	require.Less(t, time.Since(start), 30*time.Second)
	requireVersion(t, tbl, 4)
	require.False(t, messageIDIndexExists(t, tbl))

	require.NoError(t, batch.Rollback(ctx))
	_, err = outbox.Migrate(ctx, conn, tbl)
	require.NoError(t, err)
	require.True(t, messageIDIndexExists(t, tbl))
}

// beforeUniqueMessageID returns an outbox at schema version 4, as before the
// upgrade that makes message_id unique.
func beforeUniqueMessageID(t *testing.T) outbox.Table {
	t.Helper()
	tbl := dbtest.Table(t)
	_, err := dbtest.Pool(t).Exec(context.Background(), fmt.Sprintf("DROP INDEX %s; UPDATE %s SET version = 4",
		pgx.Identifier{tbl.Schema, "outbox_message_id_key"}.Sanitize(),
		outbox.VersionIdent(tbl)))
	require.NoError(t, err)
	return tbl
}

// lockedOutbox holds the lock a sweeper's batch in flight holds on tbl, until
// the returned transaction ends.
func lockedOutbox(t *testing.T, tbl outbox.Table) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	batch, err := dbtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	_, err = batch.Exec(ctx, "LOCK TABLE "+ident(tbl)+" IN ROW EXCLUSIVE MODE")
	require.NoError(t, err)
	return batch
}

func migrationConn(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbtest.URL(t))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func requireVersion(t *testing.T, tbl outbox.Table, want int32) {
	t.Helper()
	v, err := outbox.CurrentSchemaVersion(context.Background(), dbtest.Pool(t), tbl)
	require.NoError(t, err)
	require.Equal(t, want, v)
}

func messageIDIndexExists(t *testing.T, tbl outbox.Table) bool {
	t.Helper()
	var exists bool
	require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL",
		pgx.Identifier{tbl.Schema, "outbox_message_id_key"}.Sanitize()).Scan(&exists))
	return exists
}

func ident(tbl outbox.Table) string { return pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize() }
