package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// partitions lists the history partitions of tbl by name, DEFAULT included.
func partitions(t *testing.T, tbl outbox.Table) []string {
	t.Helper()
	rows, err := dbtest.Pool(t).Query(context.Background(),
		"SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::text::regclass ORDER BY 1",
		outbox.HistoryIdent(tbl))
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

// A page's end moves the rows the broker accepted to history, whole and
// stamped, in the page's transaction; the rows of a send that failed stay in
// the outbox, untouched but for what the failure recorded.
func TestAPageMovesItsSentRowsToHistoryAndLeavesTheFailedOnesInTheOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, outbox.Message{Topic: "bad", Payload: []byte("bad-0"), CorrelationID: "c-bad"})
	writeMessages(t, tbl, outbox.Message{Topic: "ok", Payload: []byte("ok-0"), CorrelationID: "c-ok",
		Headers: map[string]any{"h": "v"}, ContentType: "text/plain", PartitionKey: "k"})
	writeMessages(t, tbl, topicMessages("ok", 3)...)
	before := readRows(t, tbl)

	prod := memory.New(memory.Config{})
	prod.FailTopic("bad", errors.New("connection reset by peer"))
	started := time.Now()
	res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, Retry: once}).Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, res.Dispatched)
	require.Equal(t, []string{"bad"}, res.FailedTopics)

	// The failed row: in the outbox, outstanding, its attempt and error kept.
	var attempts int
	var lastError *string
	var dispatched *time.Time
	require.NoError(t, dbtest.Pool(t).QueryRow(ctx, "SELECT attempts, last_error, dispatched_at FROM "+
		pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()+" WHERE topic = 'bad'").Scan(&attempts, &lastError, &dispatched))
	require.Equal(t, 1, attempts)
	require.NotNil(t, lastError)
	require.Contains(t, *lastError, "connection reset by peer")
	require.Nil(t, dispatched)
	require.Zero(t, count(t, "SELECT count(*) FROM "+outbox.HistoryIdent(tbl)+" WHERE topic = 'bad'"), "not moved")
	require.Equal(t, 1, dbtest.Outstanding(t, tbl), "only the failed row is left in the outbox")
	require.Equal(t, 1, count(t, "SELECT count(*) FROM "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()), "the outbox holds outstanding rows only")

	// The sent rows: in history, every column as written, with dispatched_at.
	require.Equal(t, 4, count(t, "SELECT count(*) FROM "+outbox.HistoryIdent(tbl)+
		" WHERE topic = 'ok' AND dispatched_at BETWEEN $1 AND clock_timestamp()", started.Add(-time.Second)))
	after := readRows(t, tbl)
	require.Len(t, after, len(before))
	for i, r := range after {
		want := before[i]
		if r.Topic == "bad" {
			require.False(t, r.Dispatched)
			continue
		}
		want.Dispatched = true
		require.Equal(t, want, r, "row %d moved whole", r.ID)
	}
	var headers map[string]string
	var contentType, partitionKey string
	require.NoError(t, dbtest.Pool(t).QueryRow(ctx, "SELECT headers, content_type, partition_key FROM "+outbox.HistoryIdent(tbl)+
		" WHERE correlation_id = 'c-ok'").Scan(&headers, &contentType, &partitionKey))
	require.Equal(t, map[string]string{"h": "v"}, headers)
	require.Equal(t, "text/plain", contentType)
	require.Equal(t, "k", partitionKey)
}

// Retention drops whole history partitions once all their rows are past the
// retention, empties the DEFAULT partition of such rows, deletes rows marked
// in the outbox before the history table (legacy), and never touches an
// outstanding row, however old. The partitions stay few.
func TestRetentionDropsWholeHistoryPartitionsAndNeverAnOutstandingRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	ident := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	const retention = 2 * time.Second
	require.Equal(t, time.Second, outbox.HistoryWidth(retention))
	r, err := outbox.NewRetention(pool, outbox.RetentionConfig{Table: tbl, Dispatched: retention})
	require.NoError(t, err)
	require.NoError(t, r.Prepare(ctx))
	require.GreaterOrEqual(t, len(partitions(t, tbl)), 1+3, "DEFAULT, the current partition and two ahead")

	// Outstanding rows, one of them created long ago; a legacy row marked
	// long ago, and one marked just now.
	writeMessages(t, tbl, topicMessages("waits", 3)...)
	writeMessages(t, tbl, topicMessages("legacy", 2)...)
	_, err = pool.Exec(ctx, "UPDATE "+ident+" SET created_at = now() - interval '30 days' WHERE topic = 'waits' AND payload = 'waits-0'")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE "+ident+" SET dispatched_at = now() - interval '1 day' WHERE payload = 'legacy-0'")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE "+ident+" SET dispatched_at = now() WHERE payload = 'legacy-1'")
	require.NoError(t, err)

	// A partition of long ago, as a run of another day made it, with its row;
	// and a row in DEFAULT that no partition covers.
	old := time.Now().Add(-time.Hour).Truncate(time.Second).UTC()
	oldName := outbox.PartitionName(tbl, old)
	oldIdent := pgx.Identifier{tbl.Schema, oldName}.Sanitize()
	_, err = pool.Exec(ctx, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
		oldIdent, outbox.HistoryIdent(tbl), old.Format(time.RFC3339), old.Add(time.Second).Format(time.RFC3339)))
	require.NoError(t, err)
	const columns = "(id, message_id, topic, payload, created_at, dispatched_at)"
	_, err = pool.Exec(ctx, "INSERT INTO "+outbox.HistoryIdent(tbl)+" "+columns+" VALUES (1001, gen_random_uuid(), 'old', 'x', $1, $1)", old)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO "+outbox.HistoryIdent(tbl)+" "+columns+" VALUES (1002, gen_random_uuid(), 'default', 'x', $1, $1)",
		time.Now().Add(-24*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 1, count(t, "SELECT count(*) FROM "+pgx.Identifier{tbl.Schema, tbl.Name + "_history_default"}.Sanitize()))

	// Rows the sweeper sends now land in the current partition.
	writeMessages(t, tbl, topicMessages("sent", 5)...)
	prod := memory.New(memory.Config{})
	prod.FailTopic("waits", errors.New("connection reset by peer"))
	_, err = newSweeper(t, pool, prod, outbox.Config{Table: tbl, Retry: once}).Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, count(t, "SELECT count(*) FROM "+outbox.HistoryIdent(tbl)+" WHERE topic = 'sent'"))
	require.Zero(t, count(t, "SELECT count(*) FROM "+pgx.Identifier{tbl.Schema, tbl.Name + "_history_default"}.Sanitize()+" WHERE topic = 'sent'"),
		"a partition was ready for them")

	res, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, res.PartitionsDropped, 1)
	require.Equal(t, 2, res.Dispatched, "the legacy row and the DEFAULT partition's, row by row")
	require.NotContains(t, partitions(t, tbl), oldName, "the old partition dropped whole")
	require.Zero(t, count(t, "SELECT count(*) FROM "+pgx.Identifier{tbl.Schema, tbl.Name + "_history_default"}.Sanitize()), "DEFAULT emptied")
	require.Equal(t, 5, count(t, "SELECT count(*) FROM "+outbox.HistoryIdent(tbl)+" WHERE topic = 'sent'"), "recent rows kept")
	require.Equal(t, []string{"legacy-1", "waits-0", "waits-1", "waits-2"},
		payloads(t, "SELECT convert_from(payload, 'UTF8') FROM "+ident+" ORDER BY 1"), "the recent legacy row and every outstanding row kept")

	// Once past the retention the sent rows' partition goes too; the
	// outstanding rows stay whatever their age, and the partitions stay few:
	// at most the retention's worth, the current one, two ahead and DEFAULT.
	dbtest.Eventually(t, patience, "the sent rows' partition dropped", func() bool {
		_, err := r.RunOnce(ctx)
		require.NoError(t, err)
		require.LessOrEqual(t, len(partitions(t, tbl)), 1+int(retention/time.Second)+1+1+2)
		return count(t, "SELECT count(*) FROM "+outbox.HistoryIdent(tbl)+" WHERE topic = 'sent'") == 0
	})
	require.Equal(t, []string{"waits-0", "waits-1", "waits-2"},
		payloads(t, "SELECT convert_from(payload, 'UTF8') FROM "+ident+" ORDER BY 1"))
	require.Equal(t, 3, dbtest.Outstanding(t, tbl))
	require.Contains(t, partitions(t, tbl), tbl.Name+"_history_default")
}

// Retention reads the partitions' bounds back right whatever the session's
// DateStyle and TimeZone: under DateStyle SQL a bound prints with a zone's
// abbreviation, and Shanghai's CST read back as US Central, 14 hours off: the
// next run planned a partition that existed and failed, every run.
func TestRetentionReadsPartitionBoundsInAnyDateStyle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	cfg, err := pgxpool.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["datestyle"] = "SQL, MDY"
	cfg.ConnConfig.RuntimeParams["timezone"] = "Asia/Shanghai"
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	r, err := outbox.NewRetention(pool, outbox.RetentionConfig{Table: tbl, Dispatched: 7 * 24 * time.Hour})
	require.NoError(t, err)
	require.NoError(t, r.Prepare(ctx))
	made := partitions(t, tbl)
	for range 2 {
		_, err := r.RunOnce(ctx)
		require.NoError(t, err)
	}
	require.Equal(t, made, partitions(t, tbl), "the partitions Prepare made are all there were to make")
}

// A partition retention cannot make (a hand-made one ending at MAXVALUE is
// in its way) stops nothing else: the run still drops the partitions past
// retention and deletes the old dead letters, and says what failed.
func TestRetentionGoesOnPastAPartitionItCannotMake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	const retention = 7 * 24 * time.Hour
	r, err := outbox.NewRetention(pool, outbox.RetentionConfig{Table: tbl, Dispatched: retention, DeadLetters: retention})
	require.NoError(t, err)

	// In the way of the partitions retention plans ahead: from tomorrow on.
	tomorrow := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	_, err = pool.Exec(ctx, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO (MAXVALUE)",
		pgx.Identifier{tbl.Schema, "by_hand"}.Sanitize(), outbox.HistoryIdent(tbl), tomorrow.Format(time.RFC3339)))
	require.NoError(t, err)
	// Past retention: a partition of long ago and a dead letter.
	old := time.Now().Add(-30 * 24 * time.Hour).UTC().Truncate(24 * time.Hour)
	oldName := outbox.PartitionName(tbl, old)
	_, err = pool.Exec(ctx, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
		pgx.Identifier{tbl.Schema, oldName}.Sanitize(), outbox.HistoryIdent(tbl), old.Format(time.RFC3339), old.Add(24*time.Hour).Format(time.RFC3339)))
	require.NoError(t, err)
	deadLetterAll(t, tbl, topicMessages("A", 2)...)
	_, err = pool.Exec(ctx, "UPDATE "+pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize()+
		" SET dead_lettered_at = now() - interval '30 days' WHERE id = 1")
	require.NoError(t, err)

	res, err := r.RunOnce(ctx)
	require.ErrorContains(t, err, "create history partition")
	require.Equal(t, 1, res.PartitionsDropped)
	require.NotContains(t, partitions(t, tbl), oldName)
	require.Equal(t, 1, res.DeadLetters)
	require.Len(t, readDeadLetters(t, tbl), 1)
}

// The partitions the sweeper creates take no autovacuum, nor does their
// TOAST table (a partition only takes inserts and is dropped whole; its
// insert-triggered vacuums ran for seconds beside a drain's neighbours,
// ADR 0001); the DEFAULT partition, which retention deletes rows from, keeps
// the server's settings.
func TestHistoryPartitionsTakeNoAutovacuumButDefaultDoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	r, err := outbox.NewRetention(pool, outbox.RetentionConfig{Table: tbl, Dispatched: 7 * 24 * time.Hour})
	require.NoError(t, err)
	require.NoError(t, r.Prepare(ctx))

	rows, err := pool.Query(ctx, `
		SELECT c.relname::text, coalesce(c.reloptions, '{}'), coalesce(toast.reloptions, '{}'), c.reltoastrelid <> 0
		FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid
		LEFT JOIN pg_class toast ON toast.oid = c.reltoastrelid
		WHERE i.inhparent = $1::text::regclass
		ORDER BY 1`, outbox.HistoryIdent(tbl))
	require.NoError(t, err)
	type partition struct {
		name          string
		opts, toast   []string
		hasToastTable bool
	}
	parts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (partition, error) {
		var p partition
		return p, row.Scan(&p.name, &p.opts, &p.toast, &p.hasToastTable)
	})
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(parts), 1+3, "DEFAULT, the current partition and two ahead")
	for _, p := range parts {
		if p.name == tbl.Name+"_history_default" {
			require.Empty(t, p.opts, "DEFAULT keeps the server's autovacuum: retention deletes from it")
			require.Empty(t, p.toast, "DEFAULT's TOAST table too")
			continue
		}
		require.Equal(t, []string{"autovacuum_enabled=false"}, p.opts, "partition %s", p.name)
		require.True(t, p.hasToastTable, "partition %s: payloads and headers are TOASTable", p.name)
		require.Equal(t, []string{"autovacuum_enabled=false"}, p.toast, "partition %s's TOAST table", p.name)
	}

	// Rows still move into them, and a retention run over them succeeds
	// (TestRetentionDropsWholeHistoryPartitionsAndNeverAnOutstandingRow
	// drops such partitions).
	writeMessages(t, tbl, topicMessages("sent", 3)...)
	_, err = newSweeper(t, pool, memory.New(memory.Config{}), outbox.Config{Table: tbl}).Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, count(t, "SELECT count(*) FROM "+outbox.HistoryIdent(tbl)+" WHERE topic = 'sent'"))
	require.Zero(t, count(t, "SELECT count(*) FROM "+pgx.Identifier{tbl.Schema, tbl.Name + "_history_default"}.Sanitize()))
	_, err = r.RunOnce(ctx)
	require.NoError(t, err)
}

func payloads(t *testing.T, query string) []string {
	t.Helper()
	rows, err := dbtest.Pool(t).Query(context.Background(), query)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// The upgrade to the history table is online: on a version-7 outbox with
// dispatched and outstanding rows, while applications write and a sweeper of
// the previous version relays (it marks rows, as version 7 did; emulated here
// by its claim statement), migrate runs; then sweepers of this version take
// over, the old one stops, and every row is delivered exactly once. No insert
// waits a second: the migration takes no lock on the outbox. Retention then
// removes the rows the old sweeper marked.
func TestTheUpgradeToHistoryIsOnlineAndDeliversEveryRowOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	ident := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	// Back to version 7, as before the upgrade.
	_, err := pool.Exec(ctx, fmt.Sprintf("DROP TABLE %s; UPDATE %s SET version = 7", outbox.HistoryIdent(tbl),
		outbox.VersionIdent(tbl)))
	require.NoError(t, err)

	var (
		mu        sync.Mutex
		written   = map[string]bool{}
		delivered = map[string]int{} // by the old sweeper
		latencies []time.Duration
	)
	// Rows from before: some already dispatched by the old sweeper.
	for i := range 300 {
		var id string
		require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+ident+" (topic, payload) VALUES ($1, 'x') RETURNING message_id::text",
			fmt.Sprintf("t%d", i%5)).Scan(&id))
		written[id] = true
	}

	// The old sweeper: claims and marks a page in one statement, "sends" it,
	// commits; what it committed is delivered.
	oldClaim := "UPDATE " + ident + " SET dispatched_at = now() WHERE id IN (SELECT id FROM " + ident +
		" WHERE dispatched_at IS NULL ORDER BY id LIMIT 50 FOR UPDATE SKIP LOCKED) RETURNING message_id::text"
	oldSweep := func() int {
		var ids []string
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, oldClaim)
			if err != nil {
				return err
			}
			ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		})
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			delivered[id]++
		}
		return len(ids)
	}
	for range 3 {
		oldSweep()
	}

	// Writers, and the old sweeper, all along.
	stopWriters, stopOld := make(chan struct{}), make(chan struct{})
	var writers, old sync.WaitGroup
	for w := range 3 {
		writers.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stopWriters:
					return
				default:
				}
				began := time.Now()
				var id string
				err := pool.QueryRow(ctx, "INSERT INTO "+ident+" (topic, payload) VALUES ($1, 'x') RETURNING message_id::text",
					fmt.Sprintf("t%d", (w+i)%5)).Scan(&id)
				took := time.Since(began)
				if err != nil {
					t.Errorf("insert: %v", err)
					return
				}
				mu.Lock()
				written[id] = true
				latencies = append(latencies, took)
				mu.Unlock()
				time.Sleep(2 * time.Millisecond) // the application's pace, not a wait for an outcome
			}
		})
	}
	old.Go(func() {
		for {
			select {
			case <-stopOld:
				return
			default:
			}
			if oldSweep() == 0 {
				time.Sleep(5 * time.Millisecond) // the old sweeper's idle poll, as its tick was
			}
		}
	})
	// The migration runs while both are at work.
	dbtest.Eventually(t, patience, "writers writing and the old sweeper delivering", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(written) >= 20 && len(delivered) > 0
	})

	conn, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	res, err := outbox.Migrate(ctx, conn, tbl)
	require.NoError(t, err)
	require.Equal(t, []string{"008_created_at_finite.sql", "009_autovacuum.sql", "010_history.sql"}, res.Applied)
	require.Positive(t, count(t, "SELECT count(*) FROM "+ident+" WHERE dispatched_at IS NOT NULL"), "the old sweeper's marks, still in the outbox")

	// This version's sweepers start beside the old one, which then stops.
	r, err := outbox.NewRetention(pool, outbox.RetentionConfig{Table: tbl, Dispatched: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, r.Prepare(ctx))
	prods := []*memory.Producer{memory.New(memory.Config{}), memory.New(memory.Config{})}
	for _, p := range prods {
		dbtest.RunSweeper(t, newSweeper(t, dbtest.NewPool(t, 4), p, outbox.Config{Table: tbl, Tick: 10 * time.Millisecond}))
	}
	dbtest.Eventually(t, patience, "the new sweepers delivering beside the old one", func() bool {
		return len(prods[0].Messages())+len(prods[1].Messages()) > 0
	})
	close(stopOld)
	old.Wait()
	mu.Lock()
	before := len(written)
	mu.Unlock()
	dbtest.Eventually(t, patience, "writers writing after the old sweeper stopped", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(written) >= before+20
	})
	close(stopWriters)
	writers.Wait()
	dbtest.Eventually(t, patience, "every row dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })

	// Exactly once, by whichever sweeper sent it.
	mu.Lock()
	defer mu.Unlock()
	sent := maps.Clone(delivered)
	for _, p := range prods {
		for _, m := range p.Messages() {
			sent[m.MessageID]++
		}
	}
	for id, n := range sent {
		require.Equal(t, 1, n, "message %s delivered %d times", id, n)
		require.True(t, written[id], "message %s was never written", id)
	}
	require.Len(t, sent, len(written), "every row written was delivered")
	require.Positive(t, len(delivered), "the old sweeper took part")
	require.Positive(t, len(sent)-len(delivered), "the new sweepers took part")
	slices.Sort(latencies)
	worst := latencies[len(latencies)-1]
	t.Logf("%d rows written during the upgrade; insert latency median %s, max %s", len(latencies), latencies[len(latencies)/2], worst)
	// Each step takes the outbox's lock for a moment, after waiting at most
	// its lock_timeout (10 s) in the queue the inserts then wait in: an
	// insert that waited longer met a lock held past that. Not a measure of
	// the moment (a second was one, and a loaded machine's scheduling alone
	// can pass it); on a table this small a rewrite would not show anyway.
	require.Less(t, worst, 10*time.Second, "an insert waited past the migrations' lock_timeout")

	// The old sweeper's marks go with retention; what remains in the outbox
	// is nothing (every row was sent).
	dbtest.Eventually(t, patience, "the legacy marked rows deleted", func() bool {
		_, err := r.RunOnce(ctx)
		require.NoError(t, err)
		return count(t, "SELECT count(*) FROM "+ident) == 0
	})
}

// The unique index on message_id covers the outbox, which holds outstanding
// rows only: a write of an id is refused while its row waits, and accepted
// once that row has been sent (moved to history, which has no unique index).
func TestAMessageIDIsFreeAgainOnceItsRowWasSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	const id = "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d99"
	writeMessages(t, tbl, outbox.Message{Topic: "orders", MessageID: id, Payload: []byte("first")})
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	write := func() error {
		return pgx.BeginFunc(ctx, dbtest.Pool(t), func(tx pgx.Tx) error {
			return w.Write(ctx, tx, outbox.Message{Topic: "orders", MessageID: id, Payload: []byte("second")})
		})
	}
	var dup *outbox.DuplicateMessageIDError
	require.ErrorAs(t, write(), &dup, "refused while the first row is outstanding")

	prod := memory.New(memory.Config{})
	_, err = newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl}).Sweep(ctx)
	require.NoError(t, err)
	require.NoError(t, write(), "accepted once the first row was sent")
	_, err = newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl}).Sweep(ctx)
	require.NoError(t, err)
	require.Len(t, prod.Messages(), 2)
	require.Equal(t, 2, count(t, "SELECT count(*) FROM "+outbox.HistoryIdent(tbl)+" WHERE message_id = $1", id), "both in history")
}

// Without the history table a sweep sends nothing and says to migrate: the
// rows it sent could never be recorded as sent, and each page rolled back
// after its sends, to be sent again at the next sweep.
func TestASweepWithoutTheHistoryTableSendsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("orders", 3)...)
	_, err := dbtest.Pool(t).Exec(ctx, "DROP TABLE "+outbox.HistoryIdent(tbl))
	require.NoError(t, err)
	prod := memory.New(memory.Config{})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl})
	for range 2 {
		_, err = s.Sweep(ctx)
		require.ErrorIs(t, err, outbox.ErrNoHistory)
		require.ErrorContains(t, err, "sweeper migrate")
	}
	require.Empty(t, prod.Messages())
	require.Equal(t, 3, dbtest.Outstanding(t, tbl))
}
