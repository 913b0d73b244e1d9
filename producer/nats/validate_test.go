package nats_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
	outboxnats "github.com/outbox-sweeper/sweeper/producer/nats"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
)

// Each row that breaks a NATS header rule is left out by Batches, before
// anything is sent, with the rule in the error; its neighbours are cut and
// stored by JetStream, and the connection they share never dropped.
func TestRowsBreakingAHeaderRuleAreRejectedBeforeTheSendAndTheirNeighboursStored(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(m *producer.Message)
		text   string
	}{
		{"header key with a space", func(m *producer.Message) { m.Headers = []byte(`{"a b":"x"}`) },
			`row 2: header "a b" has " " at byte 1: a header name must be printable ASCII without spaces or separators (RFC 7230 token)`},
		{"header key with a colon", func(m *producer.Message) { m.Headers = []byte(`{"a:b":"x"}`) }, `header "a:b" has ":" at byte 1`},
		{"header key not ASCII", func(m *producer.Message) { m.Headers = []byte(`{"clé":"x"}`) }, `header "clé" has "\xc3" at byte 2`},
		{"empty header key", func(m *producer.Message) { m.Headers = []byte(`{"":"x"}`) }, `row 2: header "" has an empty name`},
		{"header value with a line feed", func(m *producer.Message) { m.Headers = []byte(`{"h":"a\nb"}`) },
			`row 2: value of header "h" has "\n" at byte 1: a header value cannot hold a line break`},
		{"header value with a carriage return", func(m *producer.Message) { m.Headers = []byte(`{"h":"a\rb"}`) }, `value of header "h" has "\r"`},
		{"correlation id with a line break", func(m *producer.Message) { m.CorrelationID = "req\r\nX-Evil: 1" },
			"row 2: correlation_id (sent as header Correlation-Id) has \"\\r\" at byte 3"},
		{"content type with a line break", func(m *producer.Message) { m.ContentType = "text/plain\n" }, "content_type (sent as header Content-Type)"},
		{"partition key with a line break", func(m *producer.Message) { m.PartitionKey = "\nk" }, "partition_key (sent as header Partition-Key)"},
		{"message id with a line break", func(m *producer.Message) { m.MessageID = "id\n" }, "message_id (sent as header Nats-Msg-Id)"},
		{"a Nats-* header", func(m *producer.Message) { m.Headers = []byte(`{"nats-rollup":"all"}`) }, "Nats-* headers are reserved for the server"},
		{"headers that are not an object", func(m *producer.Message) { m.Headers = []byte(`"x"`) }, "headers of row 2 are not a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, outboxnats.Config{}, jetstream.StreamConfig{})
			nc := outboxnats.Conn(f.p)
			reconnects := nc.Stats().Reconnects
			subj := f.subject(strings.ReplaceAll(tc.name, " ", "_"))
			in := producertest.Messages(subj, 1, 3)
			tc.mutate(&in[1])

			batches, err := f.p.Batches(context.Background(), subj, in)
			require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "%v", err)
			require.Equal(t, []int64{2}, producer.MessageIDs(err))
			require.Equal(t, producer.ReasonInvalidMessage, producer.RowReason(err, 2))
			require.ErrorContains(t, err, tc.text)
			require.Len(t, batches, 1)
			require.Equal(t, []int64{1, 3}, batches[0].IDs())

			// Send checks again: the bad row sent anyway fails alone.
			err = f.p.Send(context.Background(), producer.Batch{Topic: subj, Messages: in})
			require.Equal(t, []int64{2}, producer.MessageIDs(err), "%v", err)

			require.NoError(t, f.p.Send(context.Background(), batches[0]))
			stored := f.stored(t, 2)
			require.Equal(t, "body-1", string(stored[0].Data()))
			require.Equal(t, "body-3", string(stored[1].Data()))
			require.Same(t, nc, outboxnats.Conn(f.p))
			require.True(t, nc.IsConnected())
			require.Equal(t, reconnects, nc.Stats().Reconnects, "the connection never dropped")
		})
	}
}

// A topic that is no valid literal subject takes no message at all: it fails as
// a topic, nothing is cut, and the shared connection goes on serving others.
func TestInvalidSubjectFailsTheTopic(t *testing.T) {
	t.Parallel()
	f := setup(t, outboxnats.Config{}, jetstream.StreamConfig{})
	nc := outboxnats.Conn(f.p)
	for _, tc := range []struct{ subject, text string }{
		{"", "is empty"},
		{f.subject("a b"), `has whitespace (" " at byte`},
		{f.subject("a\tb"), `has whitespace ("\t"`},
		{f.subject("a\r\nb"), `has whitespace ("\r"`},
		{f.subject("a..b"), "has an empty token (token 3: a leading, trailing or doubled dot)"},
		{"." + f.prefix, "has an empty token (token 1"},
		{f.prefix + ".", "has an empty token (token 2"},
		{f.subject("*"), `has the wildcard token "*", which a publish cannot name`},
		{f.subject(">"), `has the wildcard token ">"`},
		{f.subject("\xff\xfe"), "is not valid UTF-8"},
		{f.subject(strings.Repeat("s", 10_000)), "is over the 4046 bytes a subject can have in NATS's maximum control line of 4096 bytes"},
	} {
		batches, err := f.p.Batches(context.Background(), tc.subject, producertest.Messages(tc.subject, 1, 2))
		require.Nil(t, batches, "%q", tc.subject)
		require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%q: %v", tc.subject, err)
		require.Equal(t, "invalid_topic", producer.ReasonOf(err))
		require.ErrorContains(t, err, tc.text)
		require.ErrorContains(t, err, "no message can be published to it")

		err = f.p.Send(context.Background(), producer.Batch{Topic: tc.subject, Messages: producertest.Messages(tc.subject, 1, 1)})
		require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "Send checks too: %q", tc.subject)
	}
	ok := f.subject("fine")
	require.NoError(t, f.p.Send(context.Background(), producer.Batch{Topic: ok, Messages: producertest.Messages(ok, 1, 1)}))
	require.Same(t, nc, outboxnats.Conn(f.p))
	require.Zero(t, nc.Stats().Reconnects)
}

// The longest subject the control line allows is stored, on the same
// connection; one byte more is refused before the send. (A subject of 10,000
// bytes made the server drop the connection, and the client print "maximum
// control line exceeded".)
func TestSubjectOfTheLongestLengthIsStoredAndOneByteMoreFailsTheTopic(t *testing.T) {
	t.Parallel()
	f := setup(t, outboxnats.Config{}, jetstream.StreamConfig{})
	nc := outboxnats.Conn(f.p)
	longest := f.subject(strings.Repeat("s", outboxnats.MaxSubject-len(f.prefix)-1))
	require.Len(t, longest, outboxnats.MaxSubject)
	in := producertest.Messages(longest, 1, 2)
	in[0].Headers = []byte(`{"tenant":"acme"}`)
	in[0].Payload = make([]byte, 900_000) // sizes of six digits in the HPUB line
	batches, err := f.p.Batches(context.Background(), longest, in)
	require.NoError(t, err)
	require.NoError(t, f.p.Send(context.Background(), batches[0]))
	stored := f.stored(t, 2)
	require.Equal(t, longest, stored[0].Subject())
	require.Same(t, nc, outboxnats.Conn(f.p))
	require.Zero(t, nc.Stats().Reconnects)

	_, err = f.p.Batches(context.Background(), longest+"s", producertest.Messages(longest+"s", 1, 1))
	require.Equal(t, producer.ClassTopic, producer.ClassOf(err))
}

// Rows rejected for different reasons in one cut keep their own.
func TestRowsRejectedForDifferentReasonsEachKeepTheirOwn(t *testing.T) {
	t.Parallel()
	p, err := outboxnats.New(outboxnats.Config{URL: "nats://127.0.0.1:1"})
	require.NoError(t, err)
	outboxnats.SetMaxPayload(p, 1000)
	in := producertest.Messages("t", 1, 4)
	in[1].Headers = []byte(`{"a b":1}`)
	in[2].Payload = make([]byte, 2000)
	batches, err := p.Batches(context.Background(), "t", in)
	require.Equal(t, []int64{2, 3}, producer.MessageIDs(err))
	require.Equal(t, producer.ReasonInvalidMessage, producer.RowReason(err, 2))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.RowReason(err, 3))
	require.Equal(t, []int64{1, 4}, batches[0].IDs())
}

// FuzzValidateNATS feeds arbitrary rows through Batches (and Send's own
// check): nothing panics, a topic error cuts nothing, and every row ends up in
// exactly one batch or is named by the error, with a reason; Send refuses no row
// that Batches kept.
func FuzzValidateNATS(f *testing.F) {
	f.Add("orders.paid", []byte(`{"a":1,"b":"x"}`), "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22", "application/json", "req-1", "pk", uint32(10))
	f.Add("a b", []byte(`{}`), "id", "", "", "", uint32(0))
	f.Add("a..b", []byte(`{"a:b":1}`), "id", "", "", "", uint32(0))
	f.Add("a.>", []byte(`{"Nats-Msg-Id":"x"}`), "", "", "", "", uint32(0))
	f.Add(strings.Repeat("s", 5000), []byte(`{"h":"a\nb"}`), "", "", "", "", uint32(0))
	f.Add("t", []byte(`{"n":{"m":[1,null]},"":2}`), "id\n", "text\r", "c", "\xff", uint32(5000))
	f.Add("\xff", []byte(`[`), "", "", "", "", uint32(0))
	f.Fuzz(func(t *testing.T, topic string, headers []byte, messageID, contentType, correlationID, partitionKey string, payload uint32) {
		p, err := outboxnats.New(outboxnats.Config{URL: "nats://127.0.0.1:1", MaxBatch: 2})
		require.NoError(t, err)
		outboxnats.SetMaxPayload(p, 3000)
		rows := producertest.Messages(topic, 1, 4)
		rows[1].Headers, rows[1].MessageID, rows[1].ContentType = headers, messageID, contentType
		rows[1].CorrelationID, rows[1].PartitionKey = correlationID, partitionKey
		rows[2].Payload = make([]byte, payload%6000)

		producertest.RequireBatchesAndSendAgree(t, p, topic, rows)
	})
}

func TestConnectErrorsHideCredentials(t *testing.T) {
	t.Parallel()
	p, err := outboxnats.New(outboxnats.Config{URL: "nats://alice:s3cret@127.0.0.1:1,nats://tok3n@127.0.0.1:2", ConnectTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	err = p.Connect(context.Background())
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")
	require.NotContains(t, err.Error(), "tok3n")
	require.Contains(t, err.Error(), "alice")
}
