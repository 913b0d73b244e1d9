package memory_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

func batch(topic string, ids ...int64) producer.Batch {
	b := producer.Batch{Topic: topic}
	for _, id := range ids {
		b.Messages = append(b.Messages, producer.Message{ID: id, Topic: topic})
	}
	return b
}

func TestFailuresAndRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := memory.New(memory.Config{})

	p.FailNextCalls(1, producer.NewTransientError("server_busy", errors.New("busy")))
	require.Equal(t, producer.ClassTransient, producer.ClassOf(p.Send(ctx, batch("a", 1))))
	require.NoError(t, p.Send(ctx, batch("a", 1)), "only the next call fails")

	p.FailTopic("b", producer.NewTopicError("topic_not_found", errors.New("404")))
	require.Equal(t, producer.ClassTopic, producer.ClassOf(p.Send(ctx, batch("b", 2))))
	require.NoError(t, p.Send(ctx, batch("c", 3)), "other topics are fine")
	p.HealTopic("b")
	require.NoError(t, p.Send(ctx, batch("b", 2)))

	p.FailMessage(5, producer.NewMessageError(producer.ReasonMessageTooLarge, nil, errors.New("too big")))
	p.FailMessage(6, producer.NewMessageError(producer.ReasonMessageTooLarge, nil, errors.New("too big")))
	err := p.Send(ctx, batch("d", 4, 5, 6))
	require.Equal(t, []int64{5, 6}, producer.MessageIDs(err), "the error names every bad row of the batch")

	require.Equal(t, []int64{1, 3, 2}, ids(p.Messages()), "failed batches record nothing")
	require.Equal(t, 6, p.Calls())

	require.NoError(t, p.Close(ctx))
	require.Equal(t, producer.ClassLocal, producer.ClassOf(p.Send(ctx, batch("a", 9))))
}

func TestSendFuncAndCancellation(t *testing.T) {
	t.Parallel()
	p := memory.New(memory.Config{})
	var seen []int64
	p.SetSendFunc(func(_ context.Context, b producer.Batch) error {
		seen = append(seen, b.IDs()...)
		return nil
	})
	require.NoError(t, p.Send(context.Background(), batch("a", 1, 2)))
	require.Equal(t, []int64{1, 2}, seen)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.Equal(t, producer.ClassLocal, producer.ClassOf(p.Send(ctx, batch("a", 3))))
	require.Len(t, p.Accepted(), 1)
}

func ids(msgs []producer.Message) []int64 {
	out := make([]int64, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}
