package kafka_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer/kafka"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
)

// FuzzValidateKafka: whatever a row holds, Batches neither panics nor loses
// it (each row is in a batch or named with a dead-letter reason, or the topic
// is refused whole), and Send never refuses a row Batches kept.
func FuzzValidateKafka(f *testing.F) {
	f.Add("orders.paid", []byte(`{"a":1,"b":"x"}`), "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22", "application/json", "req-1", "pk", uint32(10))
	f.Add("a b", []byte(`{}`), "id", "", "", "", uint32(0))
	f.Add("..", []byte(`{"message-id":1}`), "id", "", "", "", uint32(0))
	f.Add("t", []byte(`{"Content-Type":"x"}`), "", "", "", "", uint32(0))
	f.Add(strings.Repeat("s", 250), []byte(`{"h":"a\nb"}`), "", "", "", "", uint32(0))
	f.Add("t", []byte(`{"n":{"m":[1,null]},"":2}`), "id\n", "text\r", "c", "\xff", uint32(5000))
	f.Add("\xff", []byte(`[`), "", "", "", "", uint32(0))
	f.Fuzz(func(t *testing.T, topic string, headers []byte, messageID, contentType, correlationID, partitionKey string, payload uint32) {
		p, err := kafka.New(kafka.Config{Brokers: []string{"127.0.0.1:1"}, MaxBatch: 2})
		require.NoError(t, err)
		defer p.Close(context.Background())
		kafka.SetLimit(p, topic, 3000)
		rows := producertest.Messages(topic, 1, 4)
		rows[1].Headers, rows[1].MessageID, rows[1].ContentType = headers, messageID, contentType
		rows[1].CorrelationID, rows[1].PartitionKey = correlationID, partitionKey
		rows[2].Payload = make([]byte, payload%6000)

		producertest.RequireBatchesAndSendAgree(t, p, topic, rows)
	})
}
