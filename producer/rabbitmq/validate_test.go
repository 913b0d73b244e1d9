package rabbitmq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
	"github.com/outbox-sweeper/sweeper/producer/rabbitmq"
)

// Each row over one of AMQP's limits is left out by Batches, before anything is
// sent, with the reason and the limit; its neighbours are cut, delivered to a
// real consumer, and the connection they share is the one that was open before.
func TestRowsOverAnAMQPLimitAreRejectedBeforeTheSendAndTheirNeighboursDelivered(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 256)
	for _, tc := range []struct {
		name   string
		mutate func(m *producer.Message)
		reason string
		text   string
	}{
		{"correlation id", func(m *producer.Message) { m.CorrelationID = strings.Repeat("c", 300) },
			producer.ReasonInvalidMessage, "row 2: correlation_id of 300 bytes is over AMQP's short-string limit of 255 bytes"},
		{"content type", func(m *producer.Message) { m.ContentType = long },
			producer.ReasonInvalidMessage, "row 2: content_type of 256 bytes is over AMQP's short-string limit of 255 bytes"},
		{"message id", func(m *producer.Message) { m.MessageID = long },
			producer.ReasonInvalidMessage, "row 2: message_id of 256 bytes is over AMQP's short-string limit of 255 bytes"},
		{"header key", func(m *producer.Message) { m.Headers = []byte(`{"` + long + `":1}`) },
			producer.ReasonInvalidMessage, "row 2: header key \"kkkk"},
		{"nested header key", func(m *producer.Message) { m.Headers = []byte(`{"outer":{"` + long + `":1}}`) },
			producer.ReasonInvalidMessage, `row 2: header key "outer"."kkkk`},
		{"header key in a table in an array", func(m *producer.Message) { m.Headers = []byte(`{"list":[1,{"` + long + `":true}]}`) },
			producer.ReasonInvalidMessage, `header key "list"."[1]"."kkkk`},
		{"header value of a megabyte", func(m *producer.Message) {
			m.Headers = []byte(`{"big":"` + strings.Repeat("v", 1<<20) + `"}`)
		}, producer.ReasonMessageTooLarge, "over the connection's frame_max of 131072 bytes"},
		{"CC header that is not an array", func(m *producer.Message) { m.Headers = []byte(`{"CC":"other.key"}`) },
			producer.ReasonInvalidMessage, `row 2: header "CC" is a string: RabbitMQ takes it as a list of extra routing keys and accepts only an array`},
		{"headers that are not an object", func(m *producer.Message) { m.Headers = []byte(`[1]`) },
			producer.ReasonInvalidMessage, "headers of row 2 are not a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, rabbitmq.Config{})
			recv := f.bind(t, "t", nil)
			conn := rabbitmq.Conn(f.p)
			in := producertest.Messages("t", 1, 3)
			tc.mutate(&in[1])

			batches, err := f.p.Batches(context.Background(), "t", in)
			require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "%v", err)
			require.Equal(t, []int64{2}, producer.MessageIDs(err))
			require.Equal(t, tc.reason, producer.RowReason(err, 2))
			require.ErrorContains(t, err, tc.text)
			require.Len(t, batches, 1)
			require.Equal(t, []int64{1, 3}, batches[0].IDs())

			// Send checks again: the bad row sent anyway fails alone, and
			// nothing of its batch is published.
			err = f.p.Send(context.Background(), producer.Batch{Topic: "t", Messages: in})
			require.Equal(t, []int64{2}, producer.MessageIDs(err), "%v", err)
			require.Equal(t, tc.reason, producer.RowReason(err, 2))

			require.NoError(t, f.p.Send(context.Background(), batches[0]))
			got := recv(2)
			require.Equal(t, "body-1", string(got[0].Body))
			require.Equal(t, "body-3", string(got[1].Body))
			require.Same(t, conn, rabbitmq.Conn(f.p), "the connection stayed up: no reconnect")
			require.False(t, conn.IsClosed())
		})
	}
}

// One cut rejects rows for different reasons, each with its own.
func TestRowsRejectedForDifferentReasonsEachKeepTheirOwn(t *testing.T) {
	t.Parallel()
	p, err := rabbitmq.New(rabbitmq.Config{URL: "amqp://127.0.0.1:1/", MaxMessageBytes: 100})
	require.NoError(t, err)
	in := producertest.Messages("t", 1, 5)
	in[1].CorrelationID = strings.Repeat("c", 256)
	in[2].Payload = make([]byte, 101)
	in[3].Headers = []byte(`{"big":"` + strings.Repeat("v", 200_000) + `"}`)
	batches, err := p.Batches(context.Background(), "t", in)
	require.Equal(t, []int64{2, 3, 4}, producer.MessageIDs(err))
	require.Equal(t, producer.ReasonInvalidMessage, producer.RowReason(err, 2))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.RowReason(err, 3))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.RowReason(err, 4))
	require.ErrorContains(t, err, "row 2: correlation_id of 256 bytes")
	require.ErrorContains(t, err, "row 3: payload of 101 bytes is over RabbitMQ's limit of 100")
	require.ErrorContains(t, err, "row 4: headers of 200010 bytes make a content header frame of")
	require.Len(t, batches, 1)
	require.Equal(t, []int64{1, 5}, batches[0].IDs())
}

// A routing key is a short string: a longer topic can take no message at all,
// so it fails as a topic and nothing is cut. One of exactly 255 bytes is
// delivered.
func TestRoutingKeyOverTheShortStringLimitFailsTheTopic(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Config{})
	conn := rabbitmq.Conn(f.p)
	tooLong := strings.Repeat("r", 256)
	batches, err := f.p.Batches(context.Background(), tooLong, producertest.Messages(tooLong, 1, 3))
	require.Nil(t, batches)
	require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
	require.Equal(t, "invalid_topic", producer.ReasonOf(err))
	require.ErrorContains(t, err, "of 256 bytes is over AMQP's short-string limit of 255 bytes")
	err = f.p.Send(context.Background(), producer.Batch{Topic: tooLong, Messages: producertest.Messages(tooLong, 1, 1)})
	require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "Send checks too")

	longest := strings.Repeat("r", 255)
	recv := f.bind(t, longest, nil)
	batches, err = f.p.Batches(context.Background(), longest, producertest.Messages(longest, 1, 2))
	require.NoError(t, err)
	require.NoError(t, f.p.Send(context.Background(), batches[0]))
	require.Len(t, recv(2), 2)
	require.Same(t, conn, rabbitmq.Conn(f.p))
}

// The header frame size is counted exactly as amqp091 writes it: a row whose
// frame is exactly frame_max is published (so the count is not short), and one
// byte more is rejected before the send.
func TestHeaderFrameOfExactlyFrameMaxIsDeliveredAndOneByteMoreIsRejected(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Config{})
	recv := f.bind(t, "t", nil)
	conn := rabbitmq.Conn(f.p)
	frameMax := rabbitmq.FrameMax(f.p)
	require.Equal(t, 131072, frameMax, "RabbitMQ's default frame_max, negotiated")

	withPad := func(n int) producer.Message {
		m := producertest.Messages("t", 1, 1)[0]
		m.CorrelationID, m.ContentType, m.PartitionKey = "corr", "text/plain", "pk"
		h, err := json.Marshal(map[string]any{"pad": strings.Repeat("x", n), "n": 1, "nested": map[string]any{"a": []any{true, nil, 1.5}}})
		require.NoError(t, err)
		m.Headers = h
		return m
	}
	pad := frameMax - rabbitmq.HeaderFrameSize(withPad(0))
	exact := withPad(pad)
	require.Equal(t, frameMax, rabbitmq.HeaderFrameSize(exact))
	batches, err := f.p.Batches(context.Background(), "t", []producer.Message{exact})
	require.NoError(t, err)
	require.NoError(t, f.p.Send(context.Background(), batches[0]))
	got := recv(1)
	require.Len(t, got[0].Headers["pad"], pad)

	over := withPad(pad + 1)
	over.ID = 2
	_, err = f.p.Batches(context.Background(), "t", []producer.Message{over})
	require.Equal(t, []int64{2}, producer.MessageIDs(err))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.RowReason(err, 2))
	require.ErrorContains(t, err, fmt.Sprintf("content header frame of %d bytes, over the connection's frame_max of %d bytes", frameMax+1, frameMax))
	require.Same(t, conn, rabbitmq.Conn(f.p))
}

// Before the first connection, rows are checked against the frame size the
// client will propose, so cutting needs no broker.
func TestBatchesBeforeAnyConnectionUseTheClientsFrameSize(t *testing.T) {
	t.Parallel()
	p, err := rabbitmq.New(rabbitmq.Config{URL: "amqp://127.0.0.1:1/"})
	require.NoError(t, err)
	require.Equal(t, 131072, rabbitmq.FrameMax(p))
	in := producertest.Messages("t", 1, 2)
	in[0].Headers = []byte(`{"big":"` + strings.Repeat("v", 131072) + `"}`)
	batches, err := p.Batches(context.Background(), "t", in)
	require.Equal(t, []int64{1}, producer.MessageIDs(err))
	require.Equal(t, []int64{2}, batches[0].IDs())
}

// FuzzValidateRabbitMQ feeds arbitrary rows through Batches (and Send's own
// check): nothing panics, a topic error cuts nothing, and every row ends up in
// exactly one batch or is named by the error, with a reason; Send refuses no row
// that Batches kept.
func FuzzValidateRabbitMQ(f *testing.F) {
	f.Add("orders.paid", []byte(`{"a":1}`), "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22", "application/json", "req-1", "pk", uint32(10), uint32(0))
	f.Add(strings.Repeat("r", 256), []byte(`{}`), "id", "", "", "", uint32(0), uint32(0))
	f.Add("t", []byte(`{"`+strings.Repeat("k", 256)+`":1}`), "id", strings.Repeat("c", 256), "", "", uint32(0), uint32(0))
	f.Add("t", []byte(`{"CC":"x","BCC":[1],"n":{"m":[{"o":null}]}}`), "", "", strings.Repeat("c", 255), "\xff", uint32(2000), uint32(140000))
	f.Add("t\xff", []byte(`[1]`), "", "", "", "", uint32(0), uint32(131000))
	f.Add("", []byte(`{"a":`), "", "", "", "", uint32(0), uint32(0))
	f.Fuzz(func(t *testing.T, topic string, headers []byte, messageID, contentType, correlationID, partitionKey string, payload, bigHeader uint32) {
		p, err := rabbitmq.New(rabbitmq.Config{URL: "amqp://127.0.0.1:1/", MaxBatch: 2, MaxMessageBytes: 1000})
		require.NoError(t, err)
		rows := producertest.Messages(topic, 1, 4)
		rows[1].Headers, rows[1].MessageID, rows[1].ContentType = headers, messageID, contentType
		rows[1].CorrelationID, rows[1].PartitionKey = correlationID, partitionKey
		rows[2].Payload = make([]byte, payload%2000)
		if bigHeader > 0 {
			rows[3].Headers = []byte(`{"big":"` + strings.Repeat("x", int(bigHeader%300_000)) + `"}`)
		}
		checkPartition(t, p, topic, rows)
	})
}

// checkPartition runs Batches on rows and checks that every row is either in
// one batch or named by the error, exactly once, and that Send refuses none of
// the rows kept.
func checkPartition(t *testing.T, p *rabbitmq.Producer, topic string, rows []producer.Message) {
	t.Helper()
	producertest.RequireBatchesAndSendAgree(t, p, topic, rows)
}
