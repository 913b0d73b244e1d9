package producer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
)

func TestClassOf(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	for _, tc := range []struct {
		name string
		err  error
		want producer.Class
	}{
		{"unclassified is transient", base, producer.ClassTransient},
		{"deadline is transient: a slow broker", context.DeadlineExceeded, producer.ClassTransient},
		{"cancelled is local: we are stopping", fmt.Errorf("send: %w", context.Canceled), producer.ClassLocal},
		{"topic", producer.NewTopicError("topic_not_found", base), producer.ClassTopic},
		{"wrapped topic", fmt.Errorf("send to x: %w", producer.NewTopicError("", base)), producer.ClassTopic},
		{"message", producer.NewMessageError(producer.ReasonMessageTooLarge, []int64{3}, base), producer.ClassMessage},
		{"explicit transient", producer.NewTransientError("server_busy", base), producer.ClassTransient},
		{"local", producer.NewLocalError(base), producer.ClassLocal},
		{"classified cancel keeps its class", producer.NewTopicError("", context.Canceled), producer.ClassTopic},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, producer.ClassOf(tc.err))
		})
	}
	require.Panics(t, func() { producer.ClassOf(nil) })
}

func TestErrorNamesClassReasonRowsAndCause(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("send batch: %w", producer.NewMessageError(producer.ReasonMessageTooLarge, []int64{4, 9}, errors.New("413 entity too large")))
	require.Equal(t, "send batch: message failure (message_too_large) of rows [4 9]: 413 entity too large", err.Error())
	require.Equal(t, []int64{4, 9}, producer.MessageIDs(err))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.ReasonOf(err))
	require.Nil(t, producer.MessageIDs(producer.NewTopicError("x", err)), "only message errors name rows")
	require.ErrorContains(t, producer.NewTopicError("unauthorized", errors.New("401")), "topic failure (unauthorized): 401")
	require.Equal(t, "", producer.ReasonOf(errors.New("plain")))
}

func TestDecodeHeaders(t *testing.T) {
	t.Parallel()
	m := producer.Message{ID: 7, Headers: []byte(`{"a":"b","n":1,"big":1234567890123456789,"f":1.5}`)}
	h, err := m.DecodeHeaders()
	require.NoError(t, err)
	require.Equal(t, map[string]any{"a": "b", "n": json.Number("1"), "big": json.Number("1234567890123456789"), "f": json.Number("1.5")}, h)
	require.Equal(t, int64(1234567890123456789), producer.HeaderNumber(h["big"].(json.Number)), "every digit kept")
	require.Equal(t, 1.5, producer.HeaderNumber(h["f"].(json.Number)))
	require.Equal(t, "12345678901234567890", producer.HeaderNumber(json.Number("12345678901234567890")), "past int64: the text, not a rounded float")
	require.Equal(t, 1.2e19, producer.HeaderNumber(json.Number("1.2e19")))

	m.Headers = []byte(`null`)
	_, err = m.DecodeHeaders()
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err))

	for _, empty := range []string{"", "{}"} {
		m.Headers = []byte(empty)
		h, err = m.DecodeHeaders()
		require.NoError(t, err)
		require.Nil(t, h)
	}

	m.Headers = []byte(`[1,2]`)
	_, err = m.DecodeHeaders()
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err))
	require.Equal(t, []int64{7}, producer.MessageIDs(err))
	require.ErrorContains(t, err, "headers of row 7 are not a JSON object")
}

func TestBatchIDs(t *testing.T) {
	t.Parallel()
	b := producer.Batch{Messages: []producer.Message{{ID: 3}, {ID: 5}}}
	require.Equal(t, []int64{3, 5}, b.IDs())
}

func TestPinOnNamesOnlyUnnamedMessageErrors(t *testing.T) {
	t.Parallel()
	cause := errors.New("too large")
	b := producer.Batch{Topic: "t", Messages: []producer.Message{{ID: 1, Payload: []byte("ab")}, {ID: 2, Payload: []byte("abcd")}, {ID: 3}}}

	err := producer.PinOnLargest(producer.NewMessageError(producer.ReasonMessageTooLarge, nil, cause), b)
	require.Equal(t, []int64{2}, producer.MessageIDs(err))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.ReasonOf(err))
	require.ErrorIs(t, err, cause)

	named := producer.NewMessageError(producer.ReasonInvalidMessage, []int64{3}, cause)
	require.Equal(t, []int64{3}, producer.MessageIDs(producer.PinOnLargest(named, b)), "a named row stays named")
	topic := producer.NewTopicError("not_found", cause)
	require.Equal(t, topic, producer.PinOn(topic, 1), "other classes are left alone")
	require.NoError(t, producer.PinOnLargest(nil, b))
}

// WithDelivered adds the rows the broker took to any error, keeping its
// class, reason and named rows; Delivered finds them through the wrapping
// producers add (PinOn, fmt.Errorf), and says none for an error without.
func TestWithDelivered(t *testing.T) {
	t.Parallel()
	require.NoError(t, producer.WithDelivered(nil, []int64{1}))
	plain := errors.New("timeout")
	require.Same(t, plain, producer.WithDelivered(plain, nil), "no rows: the error as it is")
	require.Nil(t, producer.Delivered(plain))

	err := producer.WithDelivered(plain, []int64{1, 2})
	require.Equal(t, producer.ClassTransient, producer.ClassOf(err))
	require.Equal(t, []int64{1, 2}, producer.Delivered(err))
	require.ErrorIs(t, err, plain)

	refused := producer.NewMessageError(producer.ReasonMessageTooLarge, []int64{3}, errors.New("too large"))
	err = producer.WithDelivered(producer.WithDelivered(refused, []int64{1}), []int64{2})
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.ReasonOf(err))
	require.Equal(t, []int64{3}, producer.MessageIDs(err))
	require.Equal(t, []int64{1, 2}, producer.Delivered(err))
	require.Nil(t, producer.Delivered(refused), "the error given is not changed")

	wrapped := producer.WithDelivered(fmt.Errorf("send: %w", refused), []int64{4})
	require.Equal(t, producer.ClassMessage, producer.ClassOf(wrapped))
	require.Equal(t, []int64{3}, producer.MessageIDs(wrapped))
	require.Equal(t, []int64{4}, producer.Delivered(wrapped))

	pinned := producer.PinOn(producer.WithDelivered(producer.NewMessageError("too_large", nil, errors.New("x")), []int64{5}), 6)
	require.Equal(t, []int64{6}, producer.MessageIDs(pinned))
	require.Equal(t, []int64{5}, producer.Delivered(pinned), "found under PinOn's wrapping")
}
