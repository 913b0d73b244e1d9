package producer_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
)

func TestRejectionsNameEveryRowWithItsOwnReason(t *testing.T) {
	t.Parallel()
	var rej producer.Rejections
	require.NoError(t, rej.Err(), "no rejection, no error")
	msgs := []producer.Message{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}}
	kept := rej.Keep(msgs, func(m *producer.Message) (string, error) {
		switch m.ID {
		case 2:
			return producer.ReasonInvalidMessage, fmt.Errorf("row 2: correlation_id of 300 bytes is over the limit")
		case 4:
			return producer.ReasonMessageTooLarge, fmt.Errorf("row 4: headers too large")
		}
		return "", nil
	})
	require.Equal(t, []int64{1, 3}, producer.Batch{Messages: kept}.IDs())
	require.Equal(t, []int64{1, 2, 3, 4}, producer.Batch{Messages: msgs}.IDs(), "the input is left as it was")
	rej.Add(2, producer.ReasonMessageTooLarge, errors.New("again")) // a row keeps its first reason

	err := rej.Err()
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err))
	require.Equal(t, []int64{2, 4}, producer.MessageIDs(err))
	require.Equal(t, producer.ReasonInvalidMessage, producer.RowReason(err, 2))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.RowReason(err, 4))
	require.ErrorContains(t, err, "row 2: correlation_id of 300 bytes is over the limit; row 4: headers too large")
	require.NotContains(t, err.Error(), "again")
	require.Equal(t, 2, rej.Len())
	require.True(t, rej.Rejected(4))
	require.False(t, rej.Rejected(3))
}

// A page of bad rows names every row but keeps the text short.
func TestRejectionsTextIsBounded(t *testing.T) {
	t.Parallel()
	var rej producer.Rejections
	for id := range int64(500) {
		rej.Add(id, producer.ReasonInvalidMessage, fmt.Errorf("row %d: bad", id))
	}
	err := rej.Err()
	require.Len(t, producer.MessageIDs(err), 500)
	require.ErrorContains(t, err, "row 9: bad; and 490 more rows")
	require.NotContains(t, err.Error(), "row 10: bad")
}

func TestQuoteCutsLongValuesOnARuneBoundary(t *testing.T) {
	t.Parallel()
	require.Equal(t, `"orders"`, producer.Quote("orders"))
	long := strings.Repeat("é", 100) // 2 bytes each: byte 64 starts a rune
	q := producer.Quote("x" + long)  // shifted by one: byte 64 is inside a rune
	require.True(t, strings.HasSuffix(q, `"…`), q)
	require.Less(t, len(q), 70)
	require.NotContains(t, q, `\x`, "no rune is cut in half")
}

// Keep copies nothing when every row passes, and keeps order otherwise.
func TestKeepCopiesNothingWhenEveryRowPasses(t *testing.T) {
	t.Parallel()
	msgs := []producer.Message{{ID: 1}, {ID: 2}, {ID: 3}}
	var r producer.Rejections
	kept := r.Keep(msgs, func(*producer.Message) (string, error) { return "", nil })
	require.Same(t, &msgs[0], &kept[0], "the same backing array")
	require.NoError(t, r.Err())
	kept = r.Keep(msgs, func(m *producer.Message) (string, error) {
		if m.ID == 2 {
			return producer.ReasonInvalidMessage, errors.New("bad")
		}
		return "", nil
	})
	require.Equal(t, []int64{1, 3}, producer.Batch{Messages: kept}.IDs())
	require.EqualValues(t, 3, msgs[2].ID, "the caller's slice untouched")
	kept = (&producer.Rejections{}).Keep(msgs[:1], func(*producer.Message) (string, error) { return "x", errors.New("bad") })
	require.Empty(t, kept)
}
