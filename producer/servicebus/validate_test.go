package servicebus

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
)

// Each row over one of Service Bus's documented property limits is left out by
// Batches, with the limit in the error, and never reaches the sender; its
// neighbours are cut and sent. A value at the limit passes.
func TestRowsOverAPropertyLimitAreRejectedBeforeTheSend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(m *producer.Message)
		reason string // "" for a row that passes
		text   string
	}{
		{"message id of 128 characters", func(m *producer.Message) { m.MessageID = strings.Repeat("i", 128) }, "", ""},
		{"message id of 129 characters", func(m *producer.Message) { m.MessageID = strings.Repeat("i", 129) },
			producer.ReasonInvalidMessage, "row 2: message_id of 129 characters is over Service Bus's limit of 128 characters"},
		{"session id of 128 two-byte characters", func(m *producer.Message) { m.PartitionKey = strings.Repeat("é", 128) }, "", ""},
		{"session id of 65 characters outside the BMP", func(m *producer.Message) { m.PartitionKey = strings.Repeat("😀", 65) },
			producer.ReasonInvalidMessage, "row 2: partition_key (sent as the session id) of 130 characters is over Service Bus's limit of 128 characters"},
		{"correlation id not UTF-8", func(m *producer.Message) { m.CorrelationID = "req\xff" },
			producer.ReasonInvalidMessage, "row 2: correlation_id is not valid UTF-8, which AMQP requires"},
		{"correlation id of 32 KB", func(m *producer.Message) { m.CorrelationID = strings.Repeat("c", 32<<10) }, "", ""},
		{"correlation id over 32 KB", func(m *producer.Message) { m.CorrelationID = strings.Repeat("c", 32<<10+1) },
			producer.ReasonMessageTooLarge, "row 2: correlation_id of 32769 bytes is over Service Bus's limit of 32768 bytes for one property"},
		{"content type not ASCII", func(m *producer.Message) { m.ContentType = "text/plain; charset=ü" },
			producer.ReasonInvalidMessage, "row 2: content_type has a non-ASCII byte at 20: AMQP sends it as a symbol, which is ASCII"},
		{"header over 32 KB", func(m *producer.Message) { m.Headers = []byte(`{"h":"` + strings.Repeat("v", 32<<10) + `"}`) },
			producer.ReasonMessageTooLarge, `row 2: header "h" of 32769 bytes is over Service Bus's limit of 32768 bytes for one property`},
		{"headers over 63 KB together", func(m *producer.Message) {
			m.Headers = mustJSON(t, map[string]string{"a": strings.Repeat("v", 30<<10), "b": strings.Repeat("v", 30<<10), "c": strings.Repeat("v", 4<<10)})
		}, producer.ReasonMessageTooLarge, "are over the 64512 bytes Service Bus allows for a message's header"},
		{"headers that are not an object", func(m *producer.Message) { m.Headers = []byte(`1`) },
			producer.ReasonInvalidMessage, "headers of row 2 are not a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(1<<20, 100)
			in := msgs("orders", 3, 10)
			tc.mutate(&in[1])
			batches, err := b.p.Batches(context.Background(), "orders", in)
			if tc.reason == "" {
				require.NoError(t, err)
				require.Equal(t, []int64{1, 2, 3}, batches[0].IDs())
				require.NoError(t, b.p.Send(context.Background(), batches[0]))
				return
			}
			require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "%v", err)
			require.Equal(t, []int64{2}, producer.MessageIDs(err))
			require.Equal(t, tc.reason, producer.RowReason(err, 2))
			require.ErrorContains(t, err, tc.text)
			require.Equal(t, []int64{1, 3}, batches[0].IDs())

			// Send checks again and sends nothing of a batch with the row.
			err = b.p.Send(context.Background(), producer.Batch{Topic: "orders", Messages: in})
			require.Equal(t, []int64{2}, producer.MessageIDs(err))
			require.Empty(t, b.senders["orders"].sent)

			require.NoError(t, b.p.Send(context.Background(), batches[0]))
			sent := b.senders["orders"].sent
			require.Len(t, sent, 1)
			require.Equal(t, "id-0001", *sent[0][0].MessageID)
			require.Equal(t, "id-0003", *sent[0][1].MessageID)
		})
	}
}

// An entity path Service Bus can never have fails the topic, and no sender is
// made for it.
func TestInvalidEntityPathFailsTheTopic(t *testing.T) {
	t.Parallel()
	b := setup(1<<20, 100)
	for _, tc := range []struct{ topic, text string }{
		{"", "entity path is empty"},
		{"orders\xff", "is not valid UTF-8, which AMQP requires"},
		{strings.Repeat("q", 261), "of 261 characters is over Service Bus's limit of 260 characters"},
	} {
		batches, err := b.p.Batches(context.Background(), tc.topic, msgs(tc.topic, 2, 1))
		require.Nil(t, batches)
		require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
		require.Equal(t, "invalid_topic", producer.ReasonOf(err))
		require.ErrorContains(t, err, tc.text)
		err = b.p.Send(context.Background(), producer.Batch{Topic: tc.topic, Messages: msgs(tc.topic, 1, 1)})
		require.Equal(t, producer.ClassTopic, producer.ClassOf(err))
	}
	require.Zero(t, b.created)
	_, err := b.p.Batches(context.Background(), strings.Repeat("q", 260), msgs("q", 1, 1))
	require.NoError(t, err)
}

// Rows rejected for different reasons in one cut keep their own, the SDK's
// own size refusal included.
func TestRowsRejectedForDifferentReasonsEachKeepTheirOwn(t *testing.T) {
	t.Parallel()
	b := setup(1000, 100)
	in := msgs("orders", 4, 10)
	in[1].MessageID = strings.Repeat("i", 200)
	in[2].Payload = make([]byte, 2000)
	batches, err := b.p.Batches(context.Background(), "orders", in)
	require.Equal(t, []int64{2, 3}, producer.MessageIDs(err))
	require.Equal(t, producer.ReasonInvalidMessage, producer.RowReason(err, 2))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.RowReason(err, 3))
	require.ErrorContains(t, err, "row 2: message_id of 200 characters")
	require.ErrorContains(t, err, "row 3 (2000 bytes of payload) is too large for an empty Service Bus batch")
	require.Equal(t, []int64{1, 4}, batches[0].IDs())
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// FuzzValidateServiceBus feeds arbitrary rows through Batches and the message
// mapping: nothing panics, a topic error cuts nothing, every row ends up in
// exactly one batch or is named by the error, with a reason, and Send sends
// every batch Batches cut.
func FuzzValidateServiceBus(f *testing.F) {
	f.Add("orders", []byte(`{"a":1,"b":"x","c":{"d":[1]}}`), "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22", "application/json", "req-1", "pk", uint32(10), uint32(0))
	f.Add(strings.Repeat("q", 261), []byte(`{}`), "id", "", "", "", uint32(0), uint32(0))
	f.Add("orders", []byte(`{"n":null}`), strings.Repeat("i", 129), "tëxt", "\xff", strings.Repeat("😀", 65), uint32(5000), uint32(40000))
	f.Add("\xff", []byte(`[`), "", "", "", "", uint32(0), uint32(0))
	f.Fuzz(func(t *testing.T, topic string, headers []byte, messageID, contentType, correlationID, partitionKey string, payload, bigHeader uint32) {
		b := setup(4000, 2)
		rows := msgs(topic, 4, 10)
		rows[1].Headers, rows[1].MessageID, rows[1].ContentType = headers, messageID, contentType
		rows[1].CorrelationID, rows[1].PartitionKey = correlationID, partitionKey
		rows[2].Payload = make([]byte, payload%8000)
		if bigHeader > 0 {
			rows[3].Headers = []byte(fmt.Sprintf(`{"big":%q}`, strings.Repeat("x", int(bigHeader%80_000))))
		}
		batches, err := b.p.Batches(context.Background(), topic, rows)
		if producertest.RequireEachRowOnce(t, topic, rows, batches, err) {
			return
		}
		for _, x := range batches {
			require.NoError(t, b.p.Send(context.Background(), x), "Send refused a batch Batches cut")
		}
	})
}
