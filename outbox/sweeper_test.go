package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/benchutil"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
	outboxsql "github.com/outbox-sweeper/sweeper/sql"
)

func newSweeper(t *testing.T, pool *pgxpool.Pool, p producer.Producer, cfg outbox.Config) *outbox.Sweeper {
	t.Helper()
	s, err := outbox.NewSweeper(pool, p, cfg)
	require.NoError(t, err)
	return s
}

// The first scenario: concurrent application transactions, a tenth of
// them rolled back, with a sweeper running all along.
//
// Per-topic order is the order in which an application commits. Transactions
// that write one topic concurrently have no order between them (a lower id may
// commit after a higher one), so each topic here is written by one goroutine:
// its commits are ordered, and the test can require its ids to arrive ascending.
func TestConcurrentWritersAreDeliveredExactlyOnceInOrder(t *testing.T) {
	t.Parallel()
	const (
		writers  = 8
		topics   = 10
		messages = 10_000
	)
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	prod := memory.New(memory.Config{MaxBatch: 50})
	stop := dbtest.RunSweeper(t, newSweeper(t, pool, prod, outbox.Config{Table: tbl, Tick: 5 * time.Millisecond, PageSize: 200}))

	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	var (
		mu         sync.Mutex
		rolledBack = map[string]bool{} // by payload
		written    int
		wg         sync.WaitGroup
	)
	for g := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			var mine []int // this goroutine's topics: g, g+8, …
			for tp := g; tp < topics; tp += writers {
				mine = append(mine, tp)
			}
			for seq := 0; ; seq++ {
				n := 1 + rng.IntN(4)
				mu.Lock()
				if written >= messages {
					mu.Unlock()
					return
				}
				n = min(n, messages-written)
				written += n
				mu.Unlock()

				msgs := make([]outbox.Message, n)
				for i := range msgs {
					tp := mine[rng.IntN(len(mine))]
					msgs[i] = outbox.Message{Topic: fmt.Sprintf("topic-%d", tp), Payload: fmt.Appendf(nil, "g%d-s%d-i%d", g, seq, i)}
				}
				rollback := rng.IntN(10) == 0
				ctx := context.Background()
				tx, err := pool.Begin(ctx)
				if !assertNoError(t, err) {
					return
				}
				if !assertNoError(t, w.Write(ctx, tx, msgs...)) {
					_ = tx.Rollback(ctx)
					return
				}
				if rollback {
					assertNoError(t, tx.Rollback(ctx))
					mu.Lock()
					for _, m := range msgs {
						rolledBack[string(m.Payload)] = true
					}
					mu.Unlock()
				} else if !assertNoError(t, tx.Commit(ctx)) {
					return
				}
			}
		})
	}
	wg.Wait()
	dbtest.Eventually(t, 60*time.Second, "every committed row dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	stop()

	committed := readRows(t, tbl)
	require.NotEmpty(t, rolledBack, "the test must roll some transactions back")
	require.Equal(t, messages, len(committed)+len(rolledBack))

	got := prod.Messages()
	seen := make(map[int64]bool, len(got))
	lastByTopic := map[string]int64{}
	for _, m := range got {
		require.False(t, seen[m.ID], "row %d delivered twice", m.ID)
		seen[m.ID] = true
		require.False(t, rolledBack[string(m.Payload)], "rolled-back message %q delivered", m.Payload)
		require.Greater(t, m.ID, lastByTopic[m.Topic], "topic %s: row %d delivered after row %d", m.Topic, m.ID, lastByTopic[m.Topic])
		lastByTopic[m.Topic] = m.ID
	}
	for _, r := range committed {
		require.True(t, seen[r.ID], "committed row %d never delivered", r.ID)
		require.True(t, r.Dispatched)
	}
	require.Len(t, got, len(committed))
}

// assertNoError reports err without stopping the goroutine's caller (require
// must not be called off the test goroutine).
func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

// A topic whose sends fail, unclassified, while the broker is up (other topics
// go): its batch is split until its first row fails alone, and only that row
// counts an attempt; the topic waits (--ordering topic), the other topics go
// on, and once the trouble passes the topic is delivered in order.
func TestFailedBatchKeepsItsRowsAndOtherTopicsGoOn(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	// Interleave the topics so A's failure sits between B's and C's rows.
	var msgs []outbox.Message
	for i := range 30 {
		msgs = append(msgs, topicMessages([]string{"A", "B", "C"}[i%3], 1)...)
	}
	writeMessages(t, tbl, msgs...)

	prod := memory.New(memory.Config{MaxBatch: 4})
	prod.FailTopic("A", errors.New("connection reset by peer"))
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, PageSize: 100, Retry: once})

	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 20, res.Dispatched)
	require.Equal(t, []string{"A"}, res.FailedTopics)
	require.Equal(t, 3, res.FailedBatches, "A's first batch, its first half, its first row")
	require.Equal(t, 2, res.Splits)
	require.Equal(t, 1, res.AttemptedRows)

	for _, r := range readRows(t, tbl) {
		if r.Topic != "A" {
			require.True(t, r.Dispatched, "row %d of %s", r.ID, r.Topic)
			continue
		}
		require.False(t, r.Dispatched)
		if r.ID == 1 { // A's first row, which failed alone
			require.Equal(t, 1, r.Attempts, "row %d", r.ID)
			require.NotNil(t, r.LastError)
			require.Contains(t, *r.LastError, "connection reset by peer")
		} else {
			require.Zero(t, r.Attempts, "row %d never failed alone", r.ID)
			require.Nil(t, r.LastError)
		}
	}
	require.Equal(t, breaker.StateClosed, s.TopicBreaker().State("A"), "one failing row is not the topic's fault")
	require.Equal(t, []outbox.TopicActivity{
		{Topic: "A", FailedBatches: 3}, {Topic: "B", Dispatched: 10}, {Topic: "C", Dispatched: 10},
	}, s.TopicActivity(), "the console's last-minute figures")
	backoffs := s.TopicBackoffs()
	require.Len(t, backoffs, 1)
	require.Equal(t, "A", backoffs[0].Topic)

	// The trouble passes: A goes once its backoff ends, in order.
	prod.HealTopic("A")
	dbtest.Eventually(t, patience, "A delivered", func() bool {
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
		return dbtest.Outstanding(t, tbl) == 0
	})
	var aIDs []int64
	for _, m := range prod.Messages() {
		if m.Topic == "A" {
			aIDs = append(aIDs, m.ID)
		}
	}
	require.True(t, slices.IsSorted(aIDs), "A delivered out of order: %v", aIDs)
	require.Len(t, aIDs, 10)
	require.Empty(t, s.TopicBackoffs(), "a success ends the backoff")
}

// A message-class failure dead-letters the rows it names, and the rest of the
// batch and of the topic go on in the same sweep: one poison message must not
// hold its topic.
func TestPoisonMessageDoesNotHoldItsTopic(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 10)...)
	prod := memory.New(memory.Config{MaxBatch: 4})
	prod.FailMessage(3, producer.NewMessageError(producer.ReasonMessageTooLarge, nil, errors.New("413")))
	prod.FailMessage(6, producer.NewMessageError(producer.ReasonInvalidMessage, nil, errors.New("bad header")))
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl})
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Empty(t, res.FailedTopics)
	require.Equal(t, 8, res.Dispatched)
	require.Equal(t, 2, res.DeadLettered)
	require.Equal(t, []int64{1, 2, 4, 5, 7, 8, 9, 10}, ids(prod.Messages()), "neighbours delivered in order")
	act := s.TopicActivity()
	require.Len(t, act, 1)
	require.Equal(t, 8, act[0].Dispatched)
	require.Equal(t, 2, act[0].DeadLettered)
	for _, r := range readRows(t, tbl) {
		require.True(t, r.Dispatched, "row %d", r.ID)
		require.Zero(t, r.Attempts, "row %d", r.ID)
	}
	dead := readDeadLetters(t, tbl)
	require.Len(t, dead, 2)
	require.Equal(t, int64(3), dead[0].ID)
	require.Equal(t, producer.ReasonMessageTooLarge, dead[0].Reason)
	require.Equal(t, []byte("A-2"), dead[0].Payload, "every byte kept")
	require.Equal(t, int64(6), dead[1].ID)
	require.Equal(t, producer.ReasonInvalidMessage, dead[1].Reason)
	require.Contains(t, dead[1].Error, "bad header")
}

// A message-class error that names no row of the batch is split until it
// stands alone: then it is that row's, which is dead-lettered with the
// error's reason, and its neighbours go without an attempt.
func TestMessageErrorNamingNoRowIsSplitDownToItsRow(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 3)...)
	prod := memory.New(memory.Config{})
	prod.SetSendFunc(func(_ context.Context, b producer.Batch) error {
		if slices.Contains(b.IDs(), 2) {
			return producer.NewMessageError(producer.ReasonInvalidMessage, []int64{999}, errors.New("rejected"))
		}
		return nil
	})
	res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl}).Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, res.Dispatched)
	require.Equal(t, 1, res.DeadLettered)
	require.Equal(t, []int64{1, 3}, ids(prod.Messages()))
	for _, r := range readRows(t, tbl) {
		require.Zero(t, r.Attempts, "row %d", r.ID)
	}
	dead := readDeadLetters(t, tbl)
	require.Len(t, dead, 1)
	require.Equal(t, int64(2), dead[0].ID)
	require.Equal(t, producer.ReasonInvalidMessage, dead[0].Reason)
}

// The ADR's case without breakers: a failing topic whose rows fill more than a
// page at the head of the outbox must not keep the sweep from the rows behind it.
func TestFailingTopicFillingPagesDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 250)...)
	writeMessages(t, tbl, topicMessages("B", 10)...)
	prod := memory.New(memory.Config{MaxBatch: 50})
	prod.FailTopic("A", producer.NewTopicError("topic_not_found", errors.New("404")))
	res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, PageSize: 100}).Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 10, res.Dispatched)
	require.Equal(t, []string{"A"}, res.FailedTopics)
	require.Equal(t, 250, dbtest.Outstanding(t, tbl))
}

// A topic whose sends never answer while the broker is up fails after the send
// timeout, transiently: split down to its first row, which counts an attempt;
// the sweep goes on. With the broker's health check failing too (a hung
// broker), nothing is charged.
func TestSendTimeoutFailsTheBatch(t *testing.T) {
	t.Parallel()
	for _, hung := range []bool{false, true} {
		t.Run(fmt.Sprintf("broker hung %v", hung), func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			writeMessages(t, tbl, topicMessages("slow", 2)...)
			prod := memory.New(memory.Config{})
			prod.SetSendFunc(func(ctx context.Context, b producer.Batch) error {
				if b.Topic == "slow" {
					<-ctx.Done()
					return ctx.Err()
				}
				return nil
			})
			if hung {
				prod.SetCheck(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
			}
			res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, SendTimeout: 100 * time.Millisecond}).Sweep(context.Background())
			require.NoError(t, err)
			require.Equal(t, []string{"slow"}, res.FailedTopics)
			for _, r := range readRows(t, tbl) {
				if hung || r.ID != 1 {
					require.Zero(t, r.Attempts, "row %d", r.ID)
					continue
				}
				require.Equal(t, 1, r.Attempts)
				require.Contains(t, *r.LastError, "timed out after 100ms (--send-timeout)")
			}
		})
	}
}

// The broker accepts a batch, then the database connection dies before the
// commit: the rows stay outstanding and are sent again (at least once, never
// lost).
func TestCommitLostAfterSendResendsTheBatch(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 5)...)

	appName := "commit-lost-" + tbl.Schema
	pool := dbtest.NamedPool(t, appName)

	prod := memory.New(memory.Config{})
	var killed sync.Once
	prod.SetSendFunc(func(ctx context.Context, b producer.Batch) error {
		killed.Do(func() {
			// The batch's transaction is idle while the broker works: end it.
			_, err := dbtest.Pool(t).Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE application_name = $1 AND state = 'idle in transaction'`, appName)
			assertNoError(t, err)
		})
		return nil
	})
	s := newSweeper(t, pool, prod, outbox.Config{Table: tbl})
	_, err := s.Sweep(context.Background())
	require.ErrorContains(t, err, "they will be sent again")
	require.Len(t, prod.Messages(), 5, "the broker took the batch")
	require.Equal(t, 5, dbtest.Outstanding(t, tbl), "but the mark was lost with the connection")

	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 5, res.Dispatched)
	require.Len(t, prod.Messages(), 10, "sent again: a duplicate, not a loss")
	require.Zero(t, dbtest.Outstanding(t, tbl))
}

func ids(msgs []producer.Message) []int64 {
	out := make([]int64, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

func TestTwoSweepersNeverSendARowTwice(t *testing.T) {
	t.Parallel()
	const rows = 20_000
	tbl := dbtest.Table(t)
	var msgs []outbox.Message
	for i := range 20 {
		msgs = append(msgs, topicMessages(fmt.Sprintf("t%d", i), rows/20)...)
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	writeMessages(t, tbl, msgs...)

	// Without topic order, so that the two meet on rows (SKIP LOCKED) rather
	// than wait for each other's topic locks (TestTwoSweepersKeepPerTopicOrder
	// runs two under topic order).
	cfg := outbox.Config{Table: tbl, Tick: 5 * time.Millisecond, PageSize: 300, Ordering: outbox.OrderingNone}
	p1, p2 := memory.New(memory.Config{MaxBatch: 20}), memory.New(memory.Config{MaxBatch: 20})
	// Each sweeper's first send waits until the other's has begun, so that
	// both take part however fast one of them drains (one sweep of a fast
	// machine can take all 20,000 rows before the other's first page): the
	// first holds its page's rows locked meanwhile, and the second claims
	// others.
	started1, started2 := make(chan struct{}), make(chan struct{})
	meet := func(mine, theirs chan struct{}) memory.SendFunc {
		var once sync.Once
		return func(ctx context.Context, _ producer.Batch) error {
			first := false
			once.Do(func() { close(mine); first = true })
			if !first {
				return nil
			}
			select {
			case <-theirs:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	p1.SetSendFunc(meet(started1, started2))
	p2.SetSendFunc(meet(started2, started1))
	stop1 := dbtest.RunSweeper(t, newSweeper(t, dbtest.NewPool(t, 6), p1, cfg))
	stop2 := dbtest.RunSweeper(t, newSweeper(t, dbtest.NewPool(t, 6), p2, cfg))
	dbtest.Eventually(t, 60*time.Second, "every row dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	stop1()
	stop2()

	seen := make(map[int64]int, rows)
	for _, m := range append(p1.Messages(), p2.Messages()...) {
		seen[m.ID]++
		require.Equal(t, 1, seen[m.ID], "row %d sent twice", m.ID)
	}
	require.Len(t, seen, rows)
	require.NotEmpty(t, p1.Messages(), "both sweepers must have taken part")
	require.NotEmpty(t, p2.Messages(), "both sweepers must have taken part")
	t.Logf("sweeper 1 sent %d rows, sweeper 2 sent %d", len(p1.Messages()), len(p2.Messages()))
}

// Two sweepers on one topic keep its order: a sweeper that finds part of a batch
// in flight elsewhere stops the topic instead of sending the rows after it. Both
// send into one producer, which records batches in the order the broker accepts
// them.
func TestTwoSweepersKeepPerTopicOrder(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 2000)...)
	prod := memory.New(memory.Config{MaxBatch: 20})
	cfg := outbox.Config{Table: tbl, Tick: 2 * time.Millisecond, PageSize: 100}
	stop1 := dbtest.RunSweeper(t, newSweeper(t, dbtest.NewPool(t, 4), prod, cfg))
	stop2 := dbtest.RunSweeper(t, newSweeper(t, dbtest.NewPool(t, 4), prod, cfg))
	dbtest.Eventually(t, 60*time.Second, "every row dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	stop1()
	stop2()
	got := ids(prod.Messages())
	require.Len(t, got, 2000)
	require.True(t, slices.IsSorted(got), "rows arrived out of id order")
}

// A sweeper stopped while the broker holds a batch: within the grace period the
// batch finishes and is marked; past it the send is cancelled and the rows stay
// outstanding. Either way nothing is lost, and a new sweeper finishes the job.
func TestStopInTheMiddleOfABatchLosesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		grace         time.Duration
		brokerAnswers bool // the broker answers within the grace period
	}{
		// A grace period no machine can run out of: the batch's mark has
		// to fit in it.
		{"batch finishes within the grace period", time.Minute, true},
		{"grace period runs out", 50 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			writeMessages(t, tbl, topicMessages("A", 10)...)

			inSend := make(chan struct{})
			var once sync.Once
			release := make(chan struct{})
			prod := memory.New(memory.Config{MaxBatch: 5})
			prod.SetSendFunc(func(ctx context.Context, b producer.Batch) error {
				once.Do(func() { close(inSend) })
				if tc.brokerAnswers {
					<-release
					return nil
				}
				<-ctx.Done() // a broker that never answers
				return ctx.Err()
			})
			s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, ShutdownTimeout: tc.grace})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()

			select {
			case <-inSend:
			case <-time.After(time.Minute):
				t.Fatal("the first batch was never sent")
			}
			// Stopped while the broker holds the batch: cancel returns once
			// Run's context is done, so the batch ends after the stop, and
			// the sweep finds it stopped before any next batch.
			cancel()
			if tc.brokerAnswers {
				close(release)
			}
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(2 * time.Minute):
				t.Fatal("Run did not return")
			}

			rows := readRows(t, tbl)
			require.Len(t, rows, 10)
			dispatched := 0
			for _, r := range rows {
				require.Zero(t, r.Attempts, "a stop is not the row's failure")
				if r.Dispatched {
					dispatched++
				}
			}
			if tc.brokerAnswers {
				require.Equal(t, 5, dispatched, "the batch in flight is marked; the next one never starts")
				require.Len(t, prod.Messages(), 5)
			} else {
				require.Zero(t, dispatched)
				require.Empty(t, prod.Messages())
			}

			next := memory.New(memory.Config{MaxBatch: 5})
			res, err := newSweeper(t, dbtest.Pool(t), next, outbox.Config{Table: tbl}).Sweep(context.Background())
			require.NoError(t, err)
			require.Equal(t, 10-dispatched, res.Dispatched)
			require.Zero(t, dbtest.Outstanding(t, tbl))
		})
	}
}

func TestSweepOfAnEmptyOutboxDoesNothing(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	prod := memory.New(memory.Config{})
	res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl}).Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, outbox.SweepResult{Idle: true}, res, "no topic has rows: not even a page is read")
	require.Zero(t, prod.Calls())
}

// A backlog larger than a page drains in one sweep, page after page.
func TestSweepDrainsABacklogPageAfterPage(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 1050)...)
	prod := memory.New(memory.Config{})
	res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, PageSize: 100}).Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1050, res.Dispatched)
	require.Equal(t, 11, res.Pages)
	require.Zero(t, dbtest.Outstanding(t, tbl))
}

// A PagingHost's limit bounds each page below PageSize, whatever it is
// asked for (a drain's pages beside quiet outboxes' sweeps, in a fleet); a
// limit of 0 or above PageSize leaves PageSize.
func TestSweepReadsPagesAPagingHostLimits(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ limit, pages int }{{100, 11}, {0, 3}, {1000, 3}} {
		tbl := dbtest.Table(t)
		writeMessages(t, tbl, topicMessages("A", 1050)...)
		prod := memory.New(memory.Config{})
		host := pagingHost{limit: c.limit}
		res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, PageSize: 500, Host: host}).Sweep(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1050, res.Dispatched, "limit %d", c.limit)
		require.Equal(t, c.pages, res.Pages, "limit %d", c.limit)
		require.Zero(t, dbtest.Outstanding(t, tbl))
	}
}

// wakingHost is an outbox.Host that wakes its sweeper when poked (never,
// without a wake channel) and never makes a sweep wait for its turn.
type wakingHost struct{ wake chan struct{} }

func (h wakingHost) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}
func (h wakingHost) Wake() <-chan struct{} { return h.wake }
func (wakingHost) Take(context.Context, bool) (func(outbox.SweepResult), error) {
	return func(outbox.SweepResult) {}, nil
}
func (wakingHost) Waiting() bool { return false }

// pagingHost is an outbox.PagingHost whose sweeps never wait for a turn.
type pagingHost struct {
	wakingHost
	limit int
}

func (h pagingHost) PageLimit() int { return h.limit }

func TestSweepExplainsAMissingTable(t *testing.T) {
	t.Parallel()
	tbl := outbox.Table{Schema: "public", Name: "no_such_outbox"}
	_, err := newSweeper(t, dbtest.Pool(t), memory.New(memory.Config{}), outbox.Config{Table: tbl}).Sweep(context.Background())
	require.ErrorContains(t, err, "outbox table public.no_such_outbox does not exist: run `sweeper migrate --schema public --table no_such_outbox`")
}

func TestConfigValidateNamesTheFlagAndValue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  outbox.Config
		want string
	}{
		{outbox.Config{PageSize: -1}, "page size (--page-size) is -1"},
		{outbox.Config{PageSize: outbox.PageSizeMax + 1}, "page size (--page-size) is 100001"},
		{outbox.Config{Concurrency: -3}, "concurrency (--concurrency) is -3"},
		{outbox.Config{Tick: time.Microsecond}, "tick (--tick) is 1µs"},
		{outbox.Config{ShutdownTimeout: -time.Second}, "shutdown timeout (--shutdown-timeout) is -1s"},
		{outbox.Config{SendTimeout: time.Nanosecond}, "send timeout (--send-timeout) is 1ns"},
		{outbox.Config{Table: outbox.Table{Name: "a-b"}}, `table (--table) is "a-b"`},
	} {
		_, err := outbox.NewSweeper(dbtest.Pool(t), memory.New(memory.Config{}), tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}

// The page's claim must read each topic through the (topic, id) index, whatever
// the planner's statistics say: here they predate a drain that dispatched most
// rows, the case in which a plainly written query walked the primary key and
// filtered every dispatched row, a second per page at this size. The primary
// key serves only the lookups by id of the rows read.
func TestPageQueryReadsTheTopicIndexWhenStatisticsAreStale(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	benchutil.Load(t, tbl, 100_000, 512, benchutil.Topics("topic", 20)) // ends with VACUUM ANALYZE
	ctx := context.Background()
	ident := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	pool := dbtest.Pool(t)
	_, err := pool.Exec(ctx, "ALTER TABLE "+ident+" SET (autovacuum_enabled = false)")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE "+ident+" SET dispatched_at = now() WHERE id % 100 < 95")
	require.NoError(t, err)

	query := outboxsql.Statement("claim_page", outboxsql.Tables{Outbox: ident})
	rows, err := pool.Query(ctx, "EXPLAIN "+query, benchutil.Topics("topic", 20), make([]int64, 20), make([]int64, 20), 25, true, "20000ms")
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	text := strings.Join(plan, "\n")
	require.Contains(t, text, tbl.Name+"_outstanding_topic_idx", text)
	require.NotContains(t, text, "Seq Scan", text)
	for i, line := range plan {
		if strings.Contains(line, "pkey") {
			require.Less(t, i+1, len(plan), text)
			require.Contains(t, plan[i+1], "Index Cond: (id = ", "the primary key may only look rows up by id:\n%s", text)
		}
	}
}

// The page's transaction plans its claim by index whatever the table's size.
// pgx prepares the claim and Postgres may keep a generic plan; one made while
// the table was small read the whole table twice a claim, and kept doing so as
// it grew (8 ms a 9-row claim at 20,000 rows, in BenchmarkLatency). Planned
// for a 5-row table, the claim reads it whole without the settings.
func TestClaimKeepsToTheIndexesWithAGenericPlanFromASmallTable(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("small", 5)...)
	ctx := context.Background()
	ident := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	pool := dbtest.Pool(t)
	_, err := pool.Exec(ctx, "VACUUM ANALYZE "+ident) // the statistics of a 5-row table, as a generic plan made early would see
	require.NoError(t, err)
	claim := outboxsql.Statement("claim_page", outboxsql.Tables{Outbox: ident})
	plan := func(settings bool) string {
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		if settings {
			_, err = tx.Exec(ctx, outbox.TxSettings)
			require.NoError(t, err)
		}
		_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan")
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "PREPARE claim_generic (text[], bigint[], bigint[], int, boolean, text) AS "+claim)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, "EXPLAIN EXECUTE claim_generic (ARRAY['topic-1', 'topic-2'], ARRAY[0, 0], ARRAY[1, 2], 50, true, '20000ms')")
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "DEALLOCATE claim_generic")
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	// Without the settings the planner reads the table whole: what the test
	// guards against happens here.
	require.Contains(t, plan(false), "Seq Scan")
	text := plan(true)
	require.NotContains(t, text, "Seq Scan", text)
	require.NotContains(t, text, "Bitmap", text)
	require.Contains(t, text, tbl.Name+"_outstanding_topic_idx", text)
}

// A batch's transaction may sit idle for the send timeout plus 5s; a send
// timeout beyond Postgres's limit for that setting is capped rather than
// failing every claim.
func TestBatchIdleTimeoutFollowsTheSendTimeoutWithinPostgresLimit(t *testing.T) {
	t.Parallel()
	require.Equal(t, 20*time.Second, outbox.IdleInTransactionTimeout(15*time.Second))
	require.Equal(t, time.Duration(math.MaxInt32)*time.Millisecond, outbox.IdleInTransactionTimeout(600*time.Hour))

	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("long", 3)...)
	prod := memory.New(memory.Config{})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, SendTimeout: 600 * time.Hour})
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, res.Dispatched)
}

// The page's claim sets its transaction's idle timeout (and commit without a
// disk sync) and takes the topic's lock before it looks at a row, whatever rows
// it finds: the bound on how long a frozen sweeper holds rows must not depend
// on the plan Postgres picks. And a claim that finds the topic's lock taken
// locks no row: another sweeper's page of the topic is in flight, and the rows
// stay free for it.
func TestClaimSetsItsIdleTimeoutAndTopicLockBeforeAnyRow(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("claimed", 3)...)
	ctx := context.Background()
	pool := dbtest.NewPool(t, 4)
	ident := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	claim := outboxsql.Statement("claim_page", outboxsql.Tables{Outbox: ident})
	rows, err := pool.Query(ctx, "SELECT id FROM "+ident+" ORDER BY id")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, ids, 3)
	key := tbl.TopicLockKey("claimed")

	// claimIn runs the claim of the topic's rows after id after in tx and
	// returns how many rows it claimed.
	claimIn := func(tx pgx.Tx, after int64, topicLock bool) int {
		rows, err := tx.Query(ctx, claim, []string{"claimed"}, []int64{after}, []int64{key}, 10, topicLock, "7000ms")
		require.NoError(t, err)
		n := 0
		for rows.Next() {
			values, err := rows.Values()
			require.NoError(t, err)
			if values[0] == false { // a claimed row, not the topic's summary
				n++
			}
		}
		require.NoError(t, rows.Err())
		return n
	}
	// heldBy reports the idle timeout in force in tx and how many advisory
	// locks its session holds.
	heldBy := func(tx pgx.Tx) (timeout string, locks int) {
		var syncCommit string
		require.NoError(t, tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&syncCommit))
		require.Equal(t, "off", syncCommit, "the claim's marks need no disk sync: lost, a row is sent again")
		require.NoError(t, tx.QueryRow(ctx, "SHOW idle_in_transaction_session_timeout").Scan(&timeout))
		require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").Scan(&locks))
		return timeout, locks
	}
	for _, tc := range []struct {
		name      string
		after     int64
		topicLock bool
		claimed   int
	}{
		{"rows, topic lock", 0, true, 3},
		{"no rows, topic lock", ids[2], true, 0},
		{"rows, no topic lock", 0, false, 3},
		{"no rows, no topic lock", ids[2], false, 0},
	} {
		func() {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }() // before the schema is dropped, also on failure
			require.Equal(t, tc.claimed, claimIn(tx, tc.after, tc.topicLock), tc.name)
			timeout, locks := heldBy(tx)
			require.Equal(t, "7s", timeout, "%s: the claim's idle timeout", tc.name)
			wantLocks := 0
			if tc.topicLock {
				wantLocks = 1
			}
			require.Equal(t, wantLocks, locks, "%s: advisory locks held", tc.name)
		}()
	}

	// Another page of the topic holds its lock: the claim takes nothing and
	// locks nothing.
	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(ctx) }()
	_, err = other.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", key)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.Zero(t, claimIn(tx, 0, true))
	timeout, locks := heldBy(tx)
	require.Equal(t, "7s", timeout)
	require.Equal(t, 0, locks, "the topic's lock is another page's")
	var free int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM (SELECT id FROM "+ident+" FOR UPDATE SKIP LOCKED) r").Scan(&free))
	require.Equal(t, 3, free, "a claim that found the topic's lock taken must lock no row")
}

// A page's transaction stays open across all of its sends, however many there
// are; its idle timeout (the send timeout plus 5 s) bounds only how long a
// frozen sweeper holds rows. A running sweeper keeps it from idling that long,
// so a page whose sends together outlast the timeout still commits, and no row
// is sent twice.
func TestPageOutlastsTheIdleTimeout(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	const topics = 12
	for i := range topics {
		writeMessages(t, tbl, topicMessages(fmt.Sprintf("t%02d", i), 2)...)
	}
	ctx := context.Background()
	const sendTimeout = time.Second
	idle := outbox.IdleInTransactionTimeout(sendTimeout)

	// Each send waits (less than the send timeout) until the page's transaction
	// is older than its idle timeout, then returns: the sends of the page
	// together outlast it, each within its own timeout.
	var outlived atomic.Bool
	prod := memory.New(memory.Config{})
	prod.SetSendFunc(func(ctx context.Context, b producer.Batch) error {
		deadline := time.Now().Add(sendTimeout * 8 / 10)
		for time.Now().Before(deadline) && !outlived.Load() {
			var old bool
			// The page's session is the one holding its topics' locks.
			err := dbtest.Pool(t).QueryRow(ctx, `SELECT coalesce(bool_or(now() - a.xact_start > $1::interval), false)
				FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
				WHERE l.locktype = 'advisory' AND (l.classid::bigint << 32 | l.objid::bigint) = $2`,
				fmt.Sprintf("%d ms", (idle+time.Second).Milliseconds()), tbl.TopicLockKey("t00")).Scan(&old)
			if err != nil {
				return err
			}
			if old {
				outlived.Store(true)
				break
			}
			// The poll's pace: it cannot decide the outcome, which is the
			// page's length; a late poll only ends this send at its deadline,
			// and the next send looks again.
			time.Sleep(20 * time.Millisecond)
		}
		return nil
	})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, Concurrency: 1, SendTimeout: sendTimeout})
	res, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.True(t, outlived.Load(), "the page ended before its transaction was older than its idle timeout (%s)", idle)
	require.Equal(t, 2*topics, res.Dispatched)
	require.Zero(t, dbtest.Outstanding(t, tbl), "the page's commit must have held")
	seen := map[int64]bool{}
	for _, m := range prod.Messages() {
		require.False(t, seen[m.ID], "row %d sent twice", m.ID)
		seen[m.ID] = true
	}
	require.Len(t, seen, 2*topics)
}

// A page's connection that drops mid-page, before the page's commit or while a
// failure is recorded, rolls the whole page back: the sweep fails, every row
// of the page is outstanding again as it was (the batch already accepted
// included: it is sent again), and the next sweep relays them all.
func TestDroppedConnectionMidPageLosesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// sendErr is what the second topic's send answers, once the page's
		// connection is gone: nil leaves the end to the page's commit; an error
		// makes the sweeper record a failure first.
		sendErr error
		// pageSize 2 makes two pages of the four rows: the second is claimed
		// in the page's transaction while the first sends, and goes with it.
		pageSize int
	}{
		{"at the commit", nil, 0},
		{"while recording a failure", errors.New("refused"), 0},
		{"with the next page claimed ahead", nil, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			writeMessages(t, tbl, topicMessages("a", 2)...)
			writeMessages(t, tbl, topicMessages("b", 2)...)
			ctx := context.Background()
			prod := memory.New(memory.Config{})
			prod.SetSendFunc(func(ctx context.Context, b producer.Batch) error {
				if b.Topic != "b" {
					return nil
				}
				// The page's session is the one holding its topics' locks; the
				// call waits until it has ended.
				var ended bool
				if err := dbtest.Pool(t).QueryRow(ctx, `SELECT bool_or(pg_terminate_backend(l.pid, 10000)) FROM pg_locks l
					WHERE l.locktype = 'advisory' AND (l.classid::bigint << 32 | l.objid::bigint) = $1`,
					tbl.TopicLockKey("a")).Scan(&ended); err != nil || !ended {
					return fmt.Errorf("end the page's session: ended %v: %w", ended, err)
				}
				return tc.sendErr
			})
			// One lane: the page holding both topics is the point.
			s := outbox.OneLane(newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, Concurrency: 1, PageSize: tc.pageSize}))
			_, err := s.Sweep(ctx)
			require.Error(t, err, "the page's end could not be recorded")
			require.Equal(t, 4, dbtest.Outstanding(t, tbl), "every row of the page is outstanding again")
			var attempts, dead int
			require.NoError(t, dbtest.Pool(t).QueryRow(ctx, "SELECT coalesce(sum(attempts), 0) FROM "+
				pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()).Scan(&attempts))
			require.Zero(t, attempts, "what the page recorded went with it")
			require.NoError(t, dbtest.Pool(t).QueryRow(ctx, "SELECT count(*) FROM "+
				pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize()).Scan(&dead))
			require.Zero(t, dead)

			prod.SetSendFunc(nil)
			var dispatched int
			for dispatched < 4 { // with pageSize 2, a topic whose first page went with the connection waits for the next sweep
				res, err := s.Sweep(ctx)
				require.NoError(t, err)
				require.NotZero(t, res.Dispatched, "a sweep with rows outstanding sends some")
				dispatched += res.Dispatched
			}
			require.Equal(t, 4, dispatched)
			require.Zero(t, dbtest.Outstanding(t, tbl))
			seen := map[int64]bool{}
			for _, m := range prod.Messages() {
				seen[m.ID] = true
			}
			require.Len(t, seen, 4, "every row delivered")
		})
	}
}

// A page's transaction claims the next page while the current one sends. A
// topic that stops in the current page must send nothing of what was claimed
// for it ahead, and the page's end must let those rows go: every row marked
// dispatched is one the broker took, and each topic's rows went in id order.
func TestPagesClaimedAheadSendNothingOfATopicThatStopped(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("a", 30)...)
	writeMessages(t, tbl, topicMessages("b", 30)...)
	ctx := context.Background()
	prod := memory.New(memory.Config{})
	refusal := producer.NewTopicError("test_refusal", errors.New("b is refused from its row b-12 on"))
	prod.SetSendFunc(func(_ context.Context, b producer.Batch) error {
		for _, m := range b.Messages {
			if string(m.Payload) == "b-12" {
				return refusal
			}
		}
		return nil
	})
	// A share of 5 rows a topic: b fails in its third page, while its fourth
	// (b-15 to b-19) has been claimed ahead. One lane, so that both topics
	// share the pages.
	s := outbox.OneLane(newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, PageSize: 10, Concurrency: 2}))
	res, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"b"}, res.FailedTopics)

	sent := map[string][]string{}
	for _, m := range prod.Messages() {
		sent[m.Topic] = append(sent[m.Topic], string(m.Payload))
	}
	want := func(topic string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s-%d", topic, i))
		}
		return out
	}
	require.Equal(t, want("a", 30), sent["a"], "a sent whole, in order")
	require.Equal(t, want("b", 10), sent["b"], "b sent up to the batch that failed, and nothing after it")

	// What moved to history is what was sent; and the rows claimed ahead were
	// claimed (locked: their tuple's xmax is the sweeper's) and let go, not
	// left alone.
	rows, err := dbtest.Pool(t).Query(ctx, "SELECT id, convert_from(payload, 'UTF8'), false, xmax::text FROM "+
		pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()+" WHERE topic = 'b' UNION ALL SELECT id, convert_from(payload, 'UTF8'), true, '' FROM "+
		outbox.HistoryIdent(tbl)+" WHERE topic = 'b' ORDER BY 1")
	require.NoError(t, err)
	type row struct {
		ID         int64
		Payload    string
		Dispatched bool
		Xmax       string
	}
	bRows, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Len(t, bRows, 30)
	for i, r := range bRows {
		require.Equal(t, fmt.Sprintf("b-%d", i), r.Payload)
		require.Equal(t, i < 10, r.Dispatched, "%s dispatched", r.Payload)
		if i >= 15 && i < 20 {
			require.NotEqual(t, "0", r.Xmax, "%s was claimed ahead, then let go", r.Payload)
		}
		if i >= 20 {
			require.Equal(t, "0", r.Xmax, "%s was never claimed: b had stopped", r.Payload)
		}
	}
	require.Equal(t, 20, dbtest.Outstanding(t, tbl))
}

// TestATransactionHoldsAtMostMaxLockedTopicsLocks: under OrderingTopic a
// page's transaction holds the advisory lock of each topic it claimed, and the
// pages claimed ahead in it must not add to them past the bound, or sweepers
// with many topics fill Postgres's shared lock table ("out of shared memory").
func TestATransactionHoldsAtMostMaxLockedTopicsLocks(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	const topics = outbox.MaxLockedTopics + 44
	var msgs []outbox.Message
	keys := make([]int64, 0, topics)
	for i := range topics {
		topic := fmt.Sprintf("t%03d", i)
		msgs = append(msgs, topicMessages(topic, 4)...)
		keys = append(keys, tbl.TopicLockKey(topic))
	}
	writeMessages(t, tbl, msgs...)
	ctx := context.Background()
	pool := dbtest.Pool(t)
	var (
		mu   sync.Mutex
		most int
	)
	prod := memory.New(memory.Config{})
	prod.SetSendFunc(func(ctx context.Context, _ producer.Batch) error {
		var n int
		err := pool.QueryRow(ctx, `SELECT coalesce(max(n), 0) FROM (
			SELECT count(*) AS n FROM pg_locks
			WHERE locktype = 'advisory' AND objsubid = 1 AND granted
			  AND ((classid::bigint << 32) | objid::bigint) = ANY($1)
			GROUP BY pid) AS per_session`, keys).Scan(&n)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		most = max(most, n)
		return nil
	})
	// A page reads MaxLockedTopics topics, two rows each, so each topic takes
	// two pages and the page claimed ahead reaches the 44 topics the first
	// page left waiting.
	s := newSweeper(t, pool, prod, outbox.Config{Table: tbl, PageSize: topics})
	res, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Empty(t, res.FailedTopics)
	require.Equal(t, 0, dbtest.Outstanding(t, tbl))
	mu.Lock()
	defer mu.Unlock()
	require.Positive(t, most, "the sends saw the page's topic locks")
	require.LessOrEqual(t, most, outbox.MaxLockedTopics, "topic locks one transaction held at once")
}

// More topics hold rows than one sweep's span pages (a slow broker, pages of
// two rows): each sweep pages from where the last one's span ran out, so
// every topic is sent within the first rows, a few sweeps. Each once paged
// from the first topic by name, and those late in the order waited until
// the earlier ones had no rows left: here a thousand rows.
func TestSweepsPageFromWhereTheLastOneStopped(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	const topics = 30
	var msgs []outbox.Message
	for i := range topics {
		msgs = append(msgs, topicMessages(fmt.Sprintf("t%02d", i), 50)...)
	}
	writeMessages(t, tbl, msgs...)
	prod := memory.New(memory.Config{})
	prod.SetSendFunc(func(context.Context, producer.Batch) error {
		// The broker's pace, not a wait for an outcome: it keeps a sweep's
		// span of a second to a few pages, fewer than the topics, whatever
		// the machine. A slower machine sends fewer pages a sweep, which
		// only spreads the topics over more sweeps: each starts where the
		// last stopped, and the bound below counts rows, not sweeps or time.
		time.Sleep(200 * time.Millisecond)
		return nil
	})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, PageSize: 2, Tick: 10 * time.Millisecond, DisableNotify: true})
	stop := dbtest.RunSweeper(t, s)
	defer stop()
	first := map[string]int{} // each topic's first row, by its place in what was sent
	dbtest.Eventually(t, 3*time.Minute, "every topic sent", func() bool {
		for i, m := range prod.Messages() {
			if _, ok := first[m.Topic]; !ok {
				first[m.Topic] = i
			}
		}
		return len(first) == topics
	})
	last := slices.Max(slices.Collect(maps.Values(first)))
	t.Logf("every topic's first row among the first %d rows sent", last+1)
	require.Less(t, last, 300, "a topic waited behind others' rows for more than a few sweeps")
}
