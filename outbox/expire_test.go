package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/internal/syncbuf"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// age moves the created_at of rows ids of tbl back by d, as if they had
// waited that long: tests make time pass for rows rather than wait for it.
func age(t *testing.T, tbl outbox.Table, d time.Duration, ids ...int64) {
	t.Helper()
	_, err := dbtest.Pool(t).Exec(context.Background(), fmt.Sprintf(
		`UPDATE %s SET created_at = created_at - $1::interval WHERE id = ANY($2)`, tbl.Ident()), d, ids)
	require.NoError(t, err)
}

// deadline sets the expires_at of rows ids of tbl to at.
func deadline(t *testing.T, tbl outbox.Table, at time.Time, ids ...int64) {
	t.Helper()
	_, err := dbtest.Pool(t).Exec(context.Background(), fmt.Sprintf(
		`UPDATE %s SET expires_at = $1 WHERE id = ANY($2)`, tbl.Ident()), at, ids)
	require.NoError(t, err)
}

func idsOf(msgs []producer.Message) []int64 {
	out := []int64{}
	for _, m := range msgs {
		out = append(out, m.ID)
	}
	return out
}

func deadIDs(dead []deadLetter, reason string) []int64 {
	out := []int64{}
	for _, d := range dead {
		if d.Reason == reason {
			out = append(out, d.ID)
		}
	}
	return out
}

// A page that mixes expired and fresh rows of one topic sends the fresh ones
// in id order, in the same batches, and moves the expired ones (past the
// topic's max age, or their own expires_at) to the dead-letter table as
// expired; none of them reaches the broker. A replay of the expired rows
// starts their clock again: they are delivered after it.
func TestExpiredRowsInAPageLeaveTheFreshOnesInOrder(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("prices", 10)...)
	writeMessages(t, tbl, topicMessages("events", 2)...)
	age(t, tbl, 2*time.Hour, 2, 5, 9, 11)             // 11 is an events row: exempt from the max age
	deadline(t, tbl, time.Now().Add(-time.Second), 7) // its own deadline passed
	deadline(t, tbl, time.Now().Add(time.Hour), 8)    // a deadline still ahead
	prod := memory.New(memory.Config{MaxBatch: 3})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, MaxAge: time.Hour,
		TopicMaxAge: map[string]time.Duration{"events": -1}})
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 4, res.Expired)
	require.Equal(t, 4, res.DeadLettered)
	require.Equal(t, 8, res.Dispatched)

	var prices []int64
	for _, m := range prod.Messages() {
		if m.Topic == "prices" {
			prices = append(prices, m.ID)
		}
	}
	require.Equal(t, []int64{1, 3, 4, 6, 8, 10}, prices, "the fresh rows, in id order")
	dead := readDeadLetters(t, tbl)
	require.Equal(t, []int64{2, 5, 7, 9}, deadIDs(dead, outbox.ReasonExpired))
	for _, d := range dead {
		if d.ID == 7 {
			require.Contains(t, d.Error, "expires_at passed")
		} else {
			require.Contains(t, d.Error, "max age of its topic (1h0m0s")
		}
	}
	require.Zero(t, dbtest.Outstanding(t, tbl))

	dl, err := outbox.NewDeadLetters(dbtest.Pool(t), tbl)
	require.NoError(t, err)
	n, err := dl.Replay(context.Background(), outbox.DeadLetterFilter{Reason: outbox.ReasonExpired})
	require.NoError(t, err)
	require.Equal(t, 4, n)
	res, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 4, res.Dispatched, "a replayed row starts afresh: no max age passed, no deadline")
	require.Zero(t, res.Expired)
}

// A tripped topic sends nothing, but its rows expire on schedule: each tick
// moves those past the max age (at the head of the topic, where the oldest
// are) and those past their own deadline (anywhere in it), while its fresh
// rows wait for the reset. The healthy topic is sent meanwhile; the storm
// guard, which would trip a topic that dead-letters many rows at once, does
// not count expiries.
func TestTrippedTopicsRowsExpireWhileItCoolsDown(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("orders", 30)...) // ids 1-30
	writeMessages(t, tbl, topicMessages("audit", 3)...)   // 31-33
	prod := memory.New(memory.Config{})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, DeadLetterLimit: 5,
		TopicMaxAge: map[string]time.Duration{"orders": 10 * time.Minute}})
	s.TopicBreaker().Trip("orders", "tripped by an operator: downstream migration")

	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Zero(t, res.Expired, "nothing is old yet")
	require.Equal(t, []int64{31, 32, 33}, idsOf(prod.Messages()))

	oldest := make([]int64, 20)
	for i := range oldest {
		oldest[i] = int64(i + 1)
	}
	age(t, tbl, time.Hour, oldest...)                  // the topic cooled down for an hour
	deadline(t, tbl, time.Now().Add(-time.Minute), 25) // and one row's own deadline passed
	res, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 21, res.Expired)
	require.Equal(t, append(oldest, 25), deadIDs(readDeadLetters(t, tbl), outbox.ReasonExpired))
	require.Len(t, prod.Messages(), 3, "a tripped topic sends nothing")
	require.Equal(t, breaker.StateTripped, s.TopicBreaker().State("orders"))
	require.Equal(t, 9, dbtest.Outstanding(t, tbl), "the fresh rows wait")

	s.TopicBreaker().Reset("orders")
	res, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 9, res.Dispatched)
	require.Zero(t, dbtest.Outstanding(t, tbl))
}

// A broker outage longer than the max age: the broker breaker is open, so
// no page is read and nothing is sent, yet every row past its max age leaves
// the outbox as expired at the next tick, in every topic, the storm guard
// notwithstanding; the rows still within it wait for the broker.
func TestBrokerOutageLongerThanTheMaxAge(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	for _, topic := range []string{"a", "b", "c"} {
		writeMessages(t, tbl, topicMessages(topic, 10)...)
	}
	writeMessages(t, tbl, topicMessages("a", 1)...) // 31: written during the outage
	broker := brokerBreaker(t, breaker.DependencyConfig{Failures: 1, OpenDuration: time.Hour})
	failBroker(t, broker, 1)
	prod := memory.New(memory.Config{})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, BrokerBreaker: broker, MaxAge: 30 * time.Minute,
		DeadLetterLimit: 2})
	old := make([]int64, 30)
	for i := range old {
		old[i] = int64(i + 1)
	}
	age(t, tbl, 45*time.Minute, old...)

	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.True(t, res.Blocked)
	require.Equal(t, 30, res.Expired)
	require.Empty(t, prod.Messages())
	require.Equal(t, old, deadIDs(readDeadLetters(t, tbl), outbox.ReasonExpired))
	first, ok := dbtest.FirstOutstanding(t, tbl, 0)
	require.True(t, ok)
	require.Equal(t, int64(31), first, "the row written during the outage waits for the broker")
	for _, topic := range []string{"a", "b", "c"} {
		require.Equal(t, breaker.StateClosed, s.TopicBreaker().State(topic), "expiries are no storm")
	}
}

// The writer stores a message's deadline through every path (one INSERT, the
// multi-row INSERT, COPY, and database/sql's JSON), and writes without one
// name no expires_at column, so they work on a schema migrated before it.
func TestWriterStoresExpiresAt(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	ctx := context.Background()
	at := time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC)
	batch := func(n int) []outbox.Message {
		msgs := topicMessages("codes", n)
		msgs[n-1].ExpiresAt = at
		return msgs
	}
	for _, n := range []int{1, 3, outbox.CopyThresholdDefault} {
		require.NoError(t, pgx.BeginFunc(ctx, dbtest.Pool(t), func(tx pgx.Tx) error { return w.Write(ctx, tx, batch(n)...) }))
	}
	db := sql.OpenDB(stdlib.GetPoolConnector(dbtest.Pool(t)))
	defer db.Close()
	require.NoError(t, w.WriteSQL(ctx, db, batch(2)...))

	rows, err := dbtest.Pool(t).Query(ctx, fmt.Sprintf(`SELECT expires_at FROM %s WHERE expires_at IS NOT NULL ORDER BY id`, tbl.Ident()))
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	require.NoError(t, err)
	require.Len(t, got, 4)
	for _, g := range got {
		require.True(t, at.Equal(g), "stored %s, want %s", g, at)
	}
	require.Equal(t, 1+3+outbox.CopyThresholdDefault+2-4, countWhere(t, tbl, "expires_at IS NULL"))

	// A schema before version 7 has no expires_at: writes without a deadline go on.
	_, err = dbtest.Pool(t).Exec(ctx, fmt.Sprintf(`DROP INDEX %s; ALTER TABLE %s DROP COLUMN expires_at`,
		pgx.Identifier{tbl.Schema, tbl.Name + "_expires_at_idx"}.Sanitize(), tbl.Ident()))
	require.NoError(t, err)
	for _, n := range []int{1, 3, outbox.CopyThresholdDefault} {
		require.NoError(t, pgx.BeginFunc(ctx, dbtest.Pool(t), func(tx pgx.Tx) error { return w.Write(ctx, tx, topicMessages("codes", n)...) }))
	}
	require.NoError(t, w.WriteSQL(ctx, db, topicMessages("codes", 2)...))
}

func countWhere(t *testing.T, tbl outbox.Table, cond string) int {
	t.Helper()
	var n int
	require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(),
		fmt.Sprintf(`SELECT count(*) FROM %s WHERE %s`, tbl.Ident(), cond)).Scan(&n))
	return n
}

// A topic both tripped and backing off is left out twice: its rows expire
// once, and the sweep goes on.
// The producer gets each row's deadline, whichever comes first: its own
// expires_at, or its topic's max age counted from created_at; none without
// either (RabbitMQ and Service Bus send the time left).
func TestTheProducerGetsTheEarlierDeadline(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	own := time.Now().Add(time.Minute).Truncate(time.Microsecond)
	writeMessages(t, tbl,
		outbox.Message{Topic: "aged", Payload: []byte("1")},
		outbox.Message{Topic: "aged", Payload: []byte("2"), ExpiresAt: own},
		outbox.Message{Topic: "aged", Payload: []byte("3"), ExpiresAt: own.Add(48 * time.Hour)},
		outbox.Message{Topic: "plain", Payload: []byte("4")},
		outbox.Message{Topic: "plain", Payload: []byte("5"), ExpiresAt: own},
	)
	prod := memory.New(memory.Config{})
	_, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, TopicMaxAge: map[string]time.Duration{"aged": time.Hour}}).Sweep(context.Background())
	require.NoError(t, err)
	got := map[string]producer.Message{}
	for _, m := range prod.Messages() {
		got[string(m.Payload)] = m
	}
	require.Len(t, got, 5)
	require.Equal(t, got["1"].CreatedAt.Add(time.Hour), got["1"].ExpiresAt, "the max age alone")
	require.True(t, own.Equal(got["2"].ExpiresAt), "its own, earlier than the max age")
	require.Equal(t, got["3"].CreatedAt.Add(time.Hour), got["3"].ExpiresAt, "the max age, earlier than its own")
	require.True(t, got["4"].ExpiresAt.IsZero(), "neither")
	require.True(t, own.Equal(got["5"].ExpiresAt), "its own alone")
}

func TestATopicLeftOutTwiceExpiresOnce(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("t", 3)...)
	prod := memory.New(memory.Config{})
	prod.FailTopic("t", producer.NewTransientError("busy", errors.New("server busy")))
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, MaxAge: time.Hour,
		Retry: breaker.Retry{Attempts: 1, Initial: time.Hour, Max: time.Hour}, TopicBackoffMax: time.Hour})
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Positive(t, res.FailedBatches)
	require.Len(t, s.TopicBackoffs(), 1, "t backs off")
	s.TopicBreaker().Trip("t", "tripped by an operator: test")
	age(t, tbl, 2*time.Hour, 1, 2, 3)
	res, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, res.Expired)
	require.Equal(t, []int64{1, 2, 3}, deadIDs(readDeadLetters(t, tbl), outbox.ReasonExpired))
}

// A row that expires while its batch waits its turn (here behind a slow
// first batch of its topic, with one batch sent at a time) is not sent: the
// deadline is checked again before each batch goes to the producer.
func TestARowThatExpiresWhileItsBatchWaitsIsNotSent(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("codes", 4)...)
	at := time.Now().Add(2 * time.Second)
	deadline(t, tbl, at, 3) // ahead, most likely, when the page is claimed and checked
	mem := memory.New(memory.Config{MaxBatch: 2})
	s := newSweeper(t, dbtest.Pool(t), slowUntil{Producer: mem, at: at}, outbox.Config{Table: tbl, Concurrency: 1})
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, res.Expired)
	require.Equal(t, []int64{1, 2, 4}, idsOf(mem.Messages()))
	require.Equal(t, []int64{3}, deadIDs(readDeadLetters(t, tbl), outbox.ReasonExpired))
}

// slowUntil is a broker that takes the batch holding row 1 only once at has
// passed: row 3's deadline passes while its batch waits behind it.
type slowUntil struct {
	producer.Producer
	at time.Time
}

func (p slowUntil) Send(ctx context.Context, b producer.Batch) error {
	if b.Messages[0].ID == 1 {
		select {
		case <-time.After(time.Until(p.at) + time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return p.Producer.Send(ctx, b)
}

// A concurrent build of the expires_at index that failed leaves an invalid
// index of its name: migration 7 refuses it, saying how to drop it, rather
// than take it for the real one (the planner would never use it).
func TestMigration7RefusesAnInvalidExpiresAtIndex(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	idx := pgx.Identifier{tbl.Schema, tbl.Name + "_expires_at_idx"}.Sanitize()
	_, err := dbtest.Pool(t).Exec(ctx, fmt.Sprintf(`UPDATE pg_index SET indisvalid = false WHERE indexrelid = '%s'::regclass;
		UPDATE %s SET version = 6`, idx, outbox.VersionIdent(tbl)))
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = outbox.Migrate(ctx, conn, tbl)
	require.ErrorContains(t, err, "_expires_at_idx exists but is not valid")
	require.ErrorContains(t, err, "DROP INDEX CONCURRENTLY")

	_, err = dbtest.Pool(t).Exec(ctx, "DROP INDEX "+idx)
	require.NoError(t, err)
	res, err := outbox.Migrate(ctx, conn, tbl)
	require.NoError(t, err)
	require.Equal(t, []string{"007_expires_at.sql", "008_created_at_finite.sql", "009_autovacuum.sql", "010_history.sql"}, res.Applied)
}

// gated is a broker that takes each batch only when the test lets it, and
// says when a send has begun.
type gated struct {
	producer.Producer
	began   chan struct{}
	release chan struct{}
}

func (g gated) Send(ctx context.Context, b producer.Batch) error {
	g.began <- struct{}{}
	select {
	case <-g.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Producer.Send(ctx, b)
}

// Stalled counts from the sweep's last progress (a send or a statement that
// returned), not from its start, and never below the floor the send timeout
// sets: a slow broker's long sends are not a wedge, a sweep that moves on is
// not one however long it lasts, and one that stops moving is.
func TestStalledCountsFromTheLastProgress(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("a", 2)...)
	g := gated{Producer: memory.New(memory.Config{MaxBatch: 1}), began: make(chan struct{}), release: make(chan struct{})}
	s := newSweeper(t, dbtest.Pool(t), g, outbox.Config{Table: tbl, Tick: time.Second, SendTimeout: time.Minute, DisableNotify: true})
	stop := dbtest.RunSweeper(t, s)
	defer stop()
	floor := outbox.StallFloor(time.Minute)

	<-g.began // the first batch is with the broker
	st, stalled := s.Stalled(time.Now(), 3)
	require.False(t, stalled)
	_, stalled = s.Stalled(st.Progress.Add(floor-time.Second), 3)
	require.False(t, stalled, "more than 3 ticks, but within the floor: a send may take its whole timeout")
	_, stalled = s.Stalled(st.Progress.Add(floor+5*time.Second), 3)
	require.True(t, stalled, "past the floor and the ticks with nothing returned")

	g.release <- struct{}{}
	<-g.began // the first send returned; the second is with the broker
	again, _ := s.Stalled(time.Now(), 3)
	require.True(t, again.Progress.After(st.Progress), "the first send's return is progress")
	require.Equal(t, st.Since, again.Since, "the same sweep")
	_, stalled = s.Stalled(again.Progress.Add(floor-time.Second), 3)
	require.False(t, stalled, "counted from the new progress")
	g.release <- struct{}{}
}

// A tick's expiry pass that fails (here the dead-letter table is gone, so its
// move cannot insert) is logged, and the topics that send go on: expiry must
// never be what stops the relay.
func TestAFailingExpiryPassDoesNotStopTheTopicsThatSend(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("orders", 3)...)
	writeMessages(t, tbl, topicMessages("held", 2)...)
	age(t, tbl, 2*time.Hour, 4, 5)
	_, err := dbtest.Pool(t).Exec(context.Background(), fmt.Sprintf(`ALTER TABLE %s RENAME TO gone`, tbl.DeadLetterIdent()))
	require.NoError(t, err)
	var logs syncbuf.Buffer
	prod := memory.New(memory.Config{})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, MaxAge: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	s.TopicBreaker().Trip("held", "tripped by an operator: test")
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, res.Dispatched)
	require.Zero(t, res.Expired)
	require.Equal(t, []int64{1, 2, 3}, idsOf(prod.Messages()))
	require.Contains(t, logs.String(), "expiring rows past their deadline failed")
	require.Equal(t, 2, dbtest.Outstanding(t, tbl), "the held topic's rows stay, nothing lost")
}

// countingTracer counts the statements whose text holds marker, sent alone or
// in a batch.
type countingTracer struct {
	marker string
	n      atomic.Int64
}

func (c *countingTracer) count(sql string) {
	if strings.Contains(sql, c.marker) {
		c.n.Add(1)
	}
}

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.count(d.SQL)
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *countingTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.count(d.SQL)
}

func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A tick with no topic left out expires nothing by age before paging (the
// pages expire their own rows): it once took "nothing left out" for "the
// broker is down" and listed every topic, and ran their expiry, each tick.
func TestATickWithNoTopicLeftOutListsNoTopicToExpire(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	cfg, err := pgxpool.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	tracer := &countingTracer{marker: "WITH RECURSIVE topics(topic)"} // outstanding_topics.sql
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	prod := memory.New(memory.Config{})
	s := newSweeper(t, pool, prod, outbox.Config{Table: tbl, MaxAge: time.Hour})
	for i := range 3 {
		writeMessages(t, tbl, topicMessages(fmt.Sprintf("t%d", i), 2)...)
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
	}
	require.Len(t, prod.Messages(), 6)
	require.Equal(t, int64(1), tracer.n.Load(), "the topics are listed once, by the cursor's seed at the start")
}
