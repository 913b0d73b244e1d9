package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/internal/syncbuf"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// The second case: one topic, three rows, row 2 fails every send with
// an error the producer does not classify, the broker breaker and the other
// settings at their defaults but for a short backoff. Rows 1 and 3 are
// delivered, row 2 is dead-lettered after --max-attempts tries, the broker
// breaker never opens, and no other row counts an attempt.
func TestOneUnclassifiedBadRowInAOneTopicOutbox(t *testing.T) {
	t.Parallel()
	for _, ordering := range []outbox.Ordering{outbox.OrderingTopic, outbox.OrderingNone} {
		t.Run(string(ordering), func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			writeMessages(t, tbl, topicMessages("only", 3)...)
			prod := memory.New(memory.Config{})
			prod.FailMessage(2, errors.New("something the producer cannot classify"))
			dep := brokerBreaker(t, breaker.DependencyConfig{})
			s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, MaxAttempts: 3, BrokerBreaker: dep, Ordering: ordering,
				Retry: breaker.Retry{Attempts: 2, Initial: time.Millisecond, Max: time.Millisecond}, TopicBackoffMax: 5 * time.Millisecond})
			sweeps := 0
			dbtest.Eventually(t, patience, "the outbox drained", func() bool {
				_, err := s.Sweep(context.Background())
				require.NoError(t, err)
				sweeps++
				require.Equal(t, breaker.DependencyClosed, dep.State(), "one bad row is not an outage")
				return dbtest.Outstanding(t, tbl) == 0
			})
			require.Equal(t, []int64{1, 3}, ids(prod.Messages()), "the good rows, in order")
			dead := readDeadLetters(t, tbl)
			require.Len(t, dead, 1)
			require.Equal(t, int64(2), dead[0].ID)
			require.Equal(t, outbox.ReasonMaxRetriesExceeded, dead[0].Reason)
			require.Equal(t, 3, dead[0].Attempts)
			for _, r := range readRows(t, tbl) {
				require.Zero(t, r.Attempts, "row %d is good", r.ID)
			}
			require.Empty(t, s.TopicBreaker().Tripped())
			t.Logf("%s: drained in %d sweeps", ordering, sweeps)
		})
	}
}

// The third case: the same bad row in a batch of fifty beside a
// healthy topic. Only it is charged and dead-lettered; its 49 neighbours are
// delivered, never attempted.
func TestGoodNeighboursAreNeverDeadLetteredWithABadRow(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("healthy", 10)...)
	writeMessages(t, tbl, topicMessages("mixed", 50)...) // rows 11 to 60
	prod := memory.New(memory.Config{MaxBatch: 50})
	prod.FailMessage(37, errors.New("unclassified"))
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, MaxAttempts: 2, Retry: once, TopicBackoffMax: -1,
		Ordering: outbox.OrderingNone})
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 59, res.Dispatched, "every row but the bad one, in the first sweep")
	require.Equal(t, 1, res.AttemptedRows)
	require.LessOrEqual(t, res.Splits, 6, "about log2(50) splits")
	_, err = s.Sweep(context.Background())
	require.NoError(t, err)
	dead := readDeadLetters(t, tbl)
	require.Len(t, dead, 1)
	require.Equal(t, int64(37), dead[0].ID)
	require.Zero(t, dbtest.Outstanding(t, tbl))
	require.Len(t, prod.Messages(), 59)
	require.Empty(t, s.TopicBreaker().Tripped(), "one bad row is not the topic's fault")
}

// A batch that fails while the broker is down is not split and charges no row,
// however many sweeps the outage lasts; when the broker is back, all goes.
func TestBrokerDownNeverSplitsNorCharges(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("only", 20)...)
	prod := memory.New(memory.Config{})
	prod.FailTopic("only", errors.New("i/o timeout")) // unclassified: the check decides
	prod.SetCheck(func(context.Context) error { return errors.New("no answer") })
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, MaxAttempts: 1, Retry: once, TopicBackoffMax: -1})
	for range 10 {
		res, err := s.Sweep(context.Background())
		require.NoError(t, err)
		require.Zero(t, res.Splits)
		require.Zero(t, res.AttemptedRows)
	}
	require.Equal(t, 10, prod.Calls(), "one send a sweep: no split")
	for _, r := range readRows(t, tbl) {
		require.Zero(t, r.Attempts, "row %d", r.ID)
	}
	require.Empty(t, readDeadLetters(t, tbl))
	prod.HealTopic("only")
	prod.SetCheck(nil)
	_, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Zero(t, dbtest.Outstanding(t, tbl))
}

// One call that rejects rows for different reasons dead-letters each with its
// own.
func TestEachDeadLetteredRowGetsItsOwnReason(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 4)...)
	prod := memory.New(memory.Config{})
	prod.SetSendFunc(func(_ context.Context, b producer.Batch) error {
		reasons := map[int64]string{}
		if slices.Contains(b.IDs(), 2) {
			reasons[2] = producer.ReasonMessageTooLarge
		}
		if slices.Contains(b.IDs(), 3) {
			reasons[3] = producer.ReasonInvalidMessage
		}
		return producer.NewRejections(reasons, errors.New("rejected"))
	})
	res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl}).Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, res.Dispatched)
	require.Equal(t, 2, res.DeadLettered)
	dead := readDeadLetters(t, tbl)
	require.Len(t, dead, 2)
	require.Equal(t, producer.ReasonMessageTooLarge, dead[0].Reason, "row 2")
	require.Equal(t, producer.ReasonInvalidMessage, dead[1].Reason, "row 3")
}

// Rows that already failed alone are sent alone, and once, in the next sweep:
// the neighbours go at once, and the half-open broker breaker's trial avoids
// them.
func TestKnownBadRowsAreSentAlone(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 8)...)
	prod := memory.New(memory.Config{})
	prod.FailMessage(4, errors.New("unclassified"))
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, Retry: breaker.Retry{Attempts: 3, Initial: time.Millisecond, Max: time.Millisecond},
		TopicBackoffMax: -1, Ordering: outbox.OrderingNone})
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 7, res.Dispatched)
	calls := prod.Calls()
	writeMessages(t, tbl, topicMessages("A", 4)...) // rows 9 to 12
	res, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Zero(t, res.Splits, "the bad row went alone: nothing to split")
	require.Equal(t, 4, res.Dispatched)
	require.Equal(t, calls+2, prod.Calls(), "row 4 alone and once, then rows 9 to 12")
}

// A topic breaker shared with a SQL_ASCII database can hold a topic that is not
// UTF-8, or one with a NUL byte; left out of paging as they are, such names
// would fail every sweep of a UTF8 database. They are dropped: no row here can
// hold them.
func TestExcludedTopicsTheDatabaseCannotHoldDoNotStallTheSweep(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("good", 3)...)
	b := breaker.New(breaker.Settings{})
	b.Trip("bad\xff\xfe", "test")
	b.Trip("nul\x00", "test")
	prod := memory.New(memory.Config{})
	res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, TopicBreaker: b}).Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, res.Dispatched)

	// Nor do they stall the expiry of the topics left out, which names them
	// to the database too.
	writeMessages(t, tbl, topicMessages("good", 3)...)
	var logs syncbuf.Buffer
	res, err = newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, TopicBreaker: b, MaxAge: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}).Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, res.Dispatched)
	require.NotContains(t, logs.String(), "failed")
}

// noCheck hides the memory producer's Check: a producer with no health check,
// as Service Bus is.
type noCheck struct{ producer.Producer }

// Without a health check, a failure is the broker's unless another send of the
// same sweep succeeded: alone, a failing topic is never split nor charged;
// beside a topic that goes, its bad row is found and charged.
func TestProducerWithoutACheckChargesOnlyWithASuccessBeside(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("bad", 4)...)
	mem := memory.New(memory.Config{})
	mem.FailMessage(2, errors.New("unclassified"))
	s := newSweeper(t, dbtest.Pool(t), noCheck{mem}, outbox.Config{Table: tbl, Retry: once, TopicBackoffMax: -1, Concurrency: 1})
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Zero(t, res.Splits, "no evidence the broker is up: nothing split")
	require.Zero(t, res.AttemptedRows)
	for _, r := range readRows(t, tbl) {
		require.Zero(t, r.Attempts, "row %d", r.ID)
	}

	// Beside a topic that goes first (its row has the lower id, and one topic
	// is sent at a time), the same bad row is found by the split and charged.
	beside := dbtest.Table(t)
	writeMessages(t, beside, topicMessages("good", 1)...)
	writeMessages(t, beside, topicMessages("bad", 4)...) // rows 2 to 5
	mem = memory.New(memory.Config{})
	mem.FailMessage(3, errors.New("unclassified"))
	s = newSweeper(t, dbtest.Pool(t), noCheck{mem}, outbox.Config{Table: beside, Retry: once, TopicBackoffMax: -1, Concurrency: 1})
	res, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Positive(t, res.Splits)
	for _, r := range readRows(t, beside) {
		if r.ID == 3 {
			require.Equal(t, 1, r.Attempts, "found by the split once a send succeeded")
		} else {
			require.Zero(t, r.Attempts, "row %d", r.ID)
		}
	}
}
