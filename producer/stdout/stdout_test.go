package stdout_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/stdout"
)

func TestSendWritesOneJSONObjectPerLine(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	p := stdout.New(&buf, stdout.Config{})
	msgs := []producer.Message{
		{ID: 1, MessageID: "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22", Topic: "orders", Payload: []byte{0, 1, 0xff},
			Headers: []byte(`{"tenant": "a\"b"}`), CorrelationID: "req \"1\"\n", ContentType: "application/json", PartitionKey: "k"},
		{ID: 2, MessageID: "00000000-0000-4000-8000-000000000002", Topic: "ordérs\u2028", Payload: nil, Headers: []byte(`{}`)},
	}
	require.NoError(t, p.Send(context.Background(), producer.Batch{Topic: "orders", Messages: msgs}))

	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, 2)
	var first struct {
		ID            int64             `json:"id"`
		MessageID     string            `json:"message_id"`
		Topic         string            `json:"topic"`
		CorrelationID *string           `json:"correlation_id"`
		ContentType   string            `json:"content_type"`
		PartitionKey  string            `json:"partition_key"`
		Headers       map[string]string `json:"headers"`
		Payload       []byte            `json:"payload"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &first))
	require.Equal(t, int64(1), first.ID)
	require.Equal(t, msgs[0].MessageID, first.MessageID)
	require.Equal(t, "req \"1\"\n", *first.CorrelationID)
	require.Equal(t, map[string]string{"tenant": `a"b`}, first.Headers)
	require.Equal(t, []byte{0, 1, 0xff}, first.Payload)
	require.Equal(t, "application/json", first.ContentType)
	require.Equal(t, "k", first.PartitionKey)

	second := map[string]any{}
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &second))
	require.Nil(t, second["correlation_id"])
	require.Equal(t, "ordérs\u2028", second["topic"])
	require.Equal(t, "", second["payload"])
	require.NotContains(t, second, "content_type", "empty optional fields are left out")
}

func TestSendRejectsInvalidHeadersAsMessageFailure(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	p := stdout.New(&buf, stdout.Config{})
	err := p.Send(context.Background(), producer.Batch{Topic: "t", Messages: []producer.Message{
		{ID: 1, Headers: []byte(`{}`)}, {ID: 2, Headers: []byte(`{"a":`)},
	}})
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err))
	require.Equal(t, []int64{2}, producer.MessageIDs(err))
	require.Empty(t, buf.String(), "a failed batch writes nothing")
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestSendReportsAFailedWriteAsTransient(t *testing.T) {
	t.Parallel()
	p := stdout.New(failingWriter{}, stdout.Config{})
	err := p.Send(context.Background(), producer.Batch{Topic: "t", Messages: []producer.Message{{ID: 1}}})
	require.ErrorContains(t, err, `write 1 messages of topic "t": broken pipe`)
	require.Equal(t, producer.ClassTransient, producer.ClassOf(err))
}

func TestBatchesCutsAtMaxBatchKeepingOrder(t *testing.T) {
	t.Parallel()
	p := stdout.New(&bytes.Buffer{}, stdout.Config{MaxBatch: 2})
	msgs := []producer.Message{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}, {ID: 5}}
	batches, err := p.Batches(context.Background(), "t", msgs)
	require.NoError(t, err)
	require.Len(t, batches, 3)
	require.Equal(t, []int64{1, 2}, batches[0].IDs())
	require.Equal(t, []int64{5}, batches[2].IDs())
	require.Equal(t, "t", batches[2].Topic)
}

func TestBatchesLeaveOutRowsWithHeadersThatAreNotJSON(t *testing.T) {
	t.Parallel()
	p := stdout.New(&bytes.Buffer{}, stdout.Config{})
	batches, err := p.Batches(context.Background(), "t", []producer.Message{
		{ID: 1, Headers: []byte(`{}`)}, {ID: 2, Headers: []byte(`{"a":`)}, {ID: 3},
	})
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err))
	require.Equal(t, []int64{2}, producer.MessageIDs(err))
	require.Equal(t, producer.ReasonInvalidMessage, producer.RowReason(err, 2))
	require.ErrorContains(t, err, "row 2: headers are not valid JSON")
	require.Len(t, batches, 1)
	require.Equal(t, []int64{1, 3}, batches[0].IDs())
}

func TestCheckAlwaysPasses(t *testing.T) {
	t.Parallel()
	var c producer.Checker = stdout.New(failingWriter{}, stdout.Config{})
	require.NoError(t, c.Check(context.Background()))
}

// FuzzValidateStdout feeds arbitrary rows through Batches and Send: nothing
// panics, every row ends up in exactly one batch or is named by the error, and
// every line written is one valid JSON object.
func FuzzValidateStdout(f *testing.F) {
	f.Add("orders", []byte(`{"a":1}`), "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22", "application/json", "req-1", "pk", uint16(3))
	f.Add("\xff\xfe", []byte(`{"a":`), "id\x01\"\\", "\xff", "\n", "\u2028", uint16(0))
	f.Add("", []byte(`[1, 2]`), "", "", "", "", uint16(100))
	f.Fuzz(func(t *testing.T, topic string, headers []byte, messageID, contentType, correlationID, partitionKey string, payload uint16) {
		var buf bytes.Buffer
		p := stdout.New(&buf, stdout.Config{MaxBatch: 2})
		rows := []producer.Message{
			{ID: 1, MessageID: "00000000-0000-4000-8000-000000000001", Topic: topic, Headers: []byte(`{}`)},
			{ID: 2, MessageID: messageID, Topic: topic, Headers: headers, ContentType: contentType,
				CorrelationID: correlationID, PartitionKey: partitionKey, Payload: make([]byte, payload)},
			{ID: 3, Topic: topic},
		}
		batches, err := p.Batches(context.Background(), topic, rows)
		var seen []int64
		for _, b := range batches {
			seen = append(seen, b.IDs()...)
		}
		if err != nil {
			require.Equal(t, producer.ClassMessage, producer.ClassOf(err))
			seen = append(seen, producer.MessageIDs(err)...)
		}
		slices.Sort(seen)
		require.Equal(t, []int64{1, 2, 3}, seen, "each row once, in a batch or in the error")
		for _, b := range batches {
			require.NoError(t, p.Send(context.Background(), b))
		}
		for line := range strings.Lines(buf.String()) {
			var obj map[string]any
			dec := json.NewDecoder(strings.NewReader(line))
			dec.UseNumber() // 1E700 is JSON, but no float64
			require.NoError(t, dec.Decode(&obj), "%q", line)
			require.False(t, dec.More(), "one object per line: %q", line)
		}
	})
}
