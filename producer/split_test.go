package producer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
)

func msgs(sizes ...int) []producer.Message {
	out := make([]producer.Message, len(sizes))
	for i, n := range sizes {
		out[i] = producer.Message{ID: int64(i + 1), Topic: "t", Payload: make([]byte, n)}
	}
	return out
}

// batchIDs returns each batch's ids, and checks every batch is of topic "t".
func batchIDs(t *testing.T, bs []producer.Batch) [][]int64 {
	var out [][]int64
	for _, b := range bs {
		require.Equal(t, "t", b.Topic)
		out = append(out, b.IDs())
	}
	return out
}

func TestSplitKeepsOrderWithinEveryLimit(t *testing.T) {
	bs, _, _ := producer.Split("t", msgs(6, 3, 2), producer.Limits{Bytes: 10})
	require.Equal(t, [][]int64{{1, 2}, {3}}, batchIDs(t, bs), "6+3 fit in 10 bytes, 6+3+2 do not")

	// Three messages a batch, 10 bytes a batch, 8 bytes a message: 5 (9 bytes)
	// is left out and its neighbours go on; 4 and 8 start batches because the
	// one before holds three.
	bs, tooBig, largest := producer.Split("t", msgs(1, 1, 4, 4, 9, 1, 1, 1, 1), producer.Limits{Messages: 3, Bytes: 10, MessageBytes: 8})
	require.Equal(t, [][]int64{{1, 2, 3}, {4, 6, 7}, {8, 9}}, batchIDs(t, bs))
	require.Equal(t, []int64{5}, tooBig)
	require.Equal(t, 9, largest)
}

func TestSplitPutsAMessageOverTheBatchBytesAloneAndCountsWithSize(t *testing.T) {
	// A message over Bytes but within MessageBytes goes in a batch of its own;
	// Size decides what counts.
	bs, tooBig, _ := producer.Split("t", msgs(2, 20, 2), producer.Limits{Bytes: 10, MessageBytes: 100})
	require.Equal(t, [][]int64{{1}, {2}, {3}}, batchIDs(t, bs))
	require.Empty(t, tooBig)

	bs, tooBig, largest := producer.Split("t", msgs(1, 1), producer.Limits{MessageBytes: 50,
		Size: func(m *producer.Message) int { return len(m.Payload) + 50 }})
	require.Empty(t, bs)
	require.Equal(t, []int64{1, 2}, tooBig)
	require.Equal(t, 51, largest)
}

func TestSplitWithoutLimitsIsOneBatch(t *testing.T) {
	bs, tooBig, _ := producer.Split("t", msgs(5, 5, 5), producer.Limits{})
	require.Equal(t, [][]int64{{1, 2, 3}}, batchIDs(t, bs))
	require.Empty(t, tooBig)
	bs, _, _ = producer.Split("t", nil, producer.Limits{Messages: 2})
	require.Empty(t, bs)
}
