package nats_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/producer"
	outboxnats "github.com/outbox-sweeper/sweeper/producer/nats"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
)

// The conformance suite against the NATS server with JetStream.
func TestConformance(t *testing.T) {
	t.Parallel()
	const maxMsgSize = 65536
	natsURL := brokertest.NATSURL(t)
	prefix := brokertest.Name("conformance")
	nc, err := natsgo.Connect(natsURL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	stream := brokertest.CreateStream(t, js, jetstream.StreamConfig{Name: prefix, Subjects: []string{prefix + ".>"}, MaxMsgSize: maxMsgSize})
	var topics atomic.Int64
	newProducer := func(t *testing.T, u string) *outboxnats.Producer {
		p, err := outboxnats.New(outboxnats.Config{URL: u})
		require.NoError(t, err)
		return p
	}
	producertest.Run(t, producertest.Harness{
		New:   func(t *testing.T) producer.Producer { return newProducer(t, natsURL) },
		Topic: func(*testing.T) string { return fmt.Sprintf("%s.topic-%d", prefix, topics.Add(1)) },
		Receive: func(t *testing.T, topic string, n int) []producertest.Received {
			c, err := stream.OrderedConsumer(context.Background(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{topic}})
			require.NoError(t, err)
			var out []producertest.Received
			for len(out) < n {
				batch, err := c.Fetch(n-len(out), jetstream.FetchMaxWait(time.Minute))
				require.NoError(t, err)
				got := 0
				for m := range batch.Messages() {
					h := m.Headers()
					r := producertest.Received{MessageID: h.Get("Nats-Msg-Id"), CorrelationID: h.Get("Correlation-Id"),
						ContentType: h.Get("Content-Type"), PartitionKey: h.Get("Partition-Key"), Payload: m.Data(), Headers: map[string]string{}}
					for k, v := range h {
						switch k {
						case "Nats-Msg-Id", "Correlation-Id", "Content-Type", "Partition-Key":
						default:
							r.Headers[k] = v[0]
						}
					}
					out = append(out, r)
					got++
				}
				require.NotZero(t, got, "%d of %d messages of %s", len(out), n, topic)
			}
			return out
		},
		// Over the stream's max_msg_size: the server refuses it in its ack.
		Poison:  func(_ *testing.T, _ producer.Producer, m *producer.Message) { m.Payload = make([]byte, maxMsgSize+1) },
		Unknown: func(*testing.T) string { return brokertest.Name("conformance-nostream") + ".x" },
		Down: func(t *testing.T) producer.Producer {
			p, err := outboxnats.New(outboxnats.Config{URL: "nats://" + producertest.ClosedAddr(t), ConnectTimeout: 5 * time.Second})
			require.NoError(t, err)
			return p
		},
		Stuck: func(t *testing.T, topic string) (producer.Producer, <-chan struct{}) {
			return producertest.Stalled(t, natsURL, topic, func(t *testing.T, u string) producer.Producer { return newProducer(t, u) })
		},
		Skip: map[string]string{
			producertest.CaseAllOrNothing: "JetStream acknowledges each message on its own: a refused message's neighbours are stored, and the error names them (producer.Delivered), so the sweeper does not send them again (the refused-mid-batch case)",
		},
	})
}
