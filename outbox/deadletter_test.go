package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// A row that always fails with a transient error is dead-lettered after exactly
// --max-attempts attempts, payload byte-identical; its neighbours before and
// after it are delivered.
func TestRowFailingTransientlyIsDeadLetteredAtMaxAttempts(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	msgs := topicMessages("A", 3)
	msgs[1].Payload = []byte{0, 0xff, 'p', 'o', 'i', 's', 'o', 'n'}
	writeMessages(t, tbl, msgs...)
	writeMessages(t, tbl, topicMessages("B", 1)...) // another topic succeeds: failures count against A
	prod := memory.New(memory.Config{MaxBatch: 1})
	prod.FailMessage(2, errors.New("connection reset")) // transient, on row 2 only
	// A high threshold keeps the topic breaker from stopping A between tries.
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, MaxAttempts: 3,
		TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1000})})
	for tick := 1; tick <= 3; tick++ {
		res, err := s.Sweep(context.Background())
		require.NoError(t, err)
		require.Equal(t, tick == 3, res.DeadLettered == 1, "tick %d", tick)
		writeMessages(t, tbl, topicMessages("B", 1)...)
	}
	dead := readDeadLetters(t, tbl)
	require.Len(t, dead, 1)
	require.Equal(t, int64(2), dead[0].ID)
	require.Equal(t, outbox.ReasonMaxRetriesExceeded, dead[0].Reason)
	require.Equal(t, 3, dead[0].Attempts)
	require.Equal(t, []byte{0, 0xff, 'p', 'o', 'i', 's', 'o', 'n'}, dead[0].Payload, "byte-identical")
	require.Contains(t, dead[0].Error, "connection reset")

	_, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Zero(t, dbtest.Outstanding(t, tbl))
	var aDelivered []int64
	for _, m := range prod.Messages() {
		if m.Topic == "A" {
			aDelivered = append(aDelivered, m.ID)
		}
	}
	require.Equal(t, []int64{1, 3}, aDelivered, "the neighbours before and after it")
}

// A message-class error on one message of a 100-message batch dead-letters
// that one and delivers the other 99.
func TestOneBadMessageOfAHundred(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 100)...)
	prod := memory.New(memory.Config{MaxBatch: 100})
	prod.FailMessage(42, producer.NewMessageError(producer.ReasonMessageTooLarge, nil, errors.New("too large")))
	res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl}).Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 99, res.Dispatched)
	require.Equal(t, 1, res.DeadLettered)
	require.Len(t, prod.Messages(), 99)
	dead := readDeadLetters(t, tbl)
	require.Len(t, dead, 1)
	require.Equal(t, int64(42), dead[0].ID)
}

// Topic-class failures never dead-letter, however many attempts the rows have.
func TestTopicFailuresNeverDeadLetter(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 2)...)
	prod := memory.New(memory.Config{})
	prod.FailTopic("A", producer.NewTopicError("not_found", errors.New("no entity")))
	b := breaker.New(breaker.Settings{})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, MaxAttempts: 1, TopicBreaker: b})
	for range 3 {
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
		b.Reset("A")
	}
	require.Empty(t, readDeadLetters(t, tbl))
	require.Equal(t, 2, dbtest.Outstanding(t, tbl))
}

type alerts struct{ got []breaker.Alert }

func (a *alerts) Alert(_ context.Context, al breaker.Alert) error {
	a.got = append(a.got, al)
	return nil
}

// The storm guard: a producer that rejects every message of a topic as
// message-class stops dead-lettering at the limit, trips the topic and alerts;
// the remaining rows stay outstanding.
func TestDeadLetterStormGuard(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 30)...)
	prod := memory.New(memory.Config{MaxBatch: 5})
	for id := int64(1); id <= 30; id++ {
		prod.FailMessage(id, producer.NewMessageError(producer.ReasonInvalidMessage, nil, errors.New("rejected")))
	}
	al := &alerts{}
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, DeadLetterLimit: 10, Alerter: al})
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 10, res.DeadLettered, "dead-lettering stops at the limit")
	require.Len(t, readDeadLetters(t, tbl), 10)
	require.Equal(t, 20, dbtest.Outstanding(t, tbl), "the rest stay outstanding")
	require.Equal(t, breaker.StateTripped, s.TopicBreaker().State("A"))
	require.Len(t, al.got, 1)
	require.Equal(t, "critical", al.got[0].Severity)
	require.Contains(t, al.got[0].Summary, `dead-letter storm on topic "A"`)
}

// Dead-lettering is one statement: when it fails midway (here the insert into
// the dead-letter table breaks a constraint), the transaction rolls back and
// the row is still in the outbox, in exactly one table.
func TestDeadLetteringIsAtomic(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 1)...)
	_, err := dbtest.Pool(t).Exec(context.Background(), fmt.Sprintf(
		"ALTER TABLE %s ADD CONSTRAINT refuse_all CHECK (reason = 'never')", pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize()))
	require.NoError(t, err)
	prod := memory.New(memory.Config{})
	prod.FailMessage(1, producer.NewMessageError(producer.ReasonInvalidMessage, nil, errors.New("bad")))
	_, err = newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl}).Sweep(context.Background())
	require.ErrorContains(t, err, "refuse_all")
	require.Empty(t, readDeadLetters(t, tbl))
	rows := readRows(t, tbl)
	require.Len(t, rows, 1, "still in the outbox")
	require.False(t, rows[0].Dispatched)
}
