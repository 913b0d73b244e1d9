package kafka_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/kafka"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
)

// The conformance suite against kfake: every case passes.
func TestConformance(t *testing.T) {
	t.Parallel()
	const limit = 65536 // each topic's max.message.bytes
	c := cluster(t, nil)
	var topics atomic.Int64
	producertest.Run(t, producertest.Harness{
		New: func(t *testing.T) producer.Producer {
			p, err := kafka.New(kafka.Config{Brokers: c.ListenAddrs()})
			require.NoError(t, err)
			return p
		},
		Topic: func(t *testing.T) string {
			topic := fmt.Sprintf("conformance-%d", topics.Add(1))
			createTopic(t, c, topic, 3, map[string]string{"max.message.bytes": fmt.Sprint(limit)})
			return topic
		},
		Receive: func(t *testing.T, topic string, n int) []producertest.Received {
			var out []producertest.Received
			for _, r := range consumeAtLeast(t, c, topic, n) {
				out = append(out, received(r))
			}
			return out
		},
		Poison:  func(_ *testing.T, _ producer.Producer, m *producer.Message) { m.Payload = make([]byte, limit+1) },
		Unknown: func(*testing.T) string { return "conformance-missing" },
		Down: func(t *testing.T) producer.Producer {
			p, err := kafka.New(kafka.Config{Brokers: []string{producertest.ClosedAddr(t)}})
			require.NoError(t, err)
			return p
		},
		Stuck: func(t *testing.T, topic string) (producer.Producer, <-chan struct{}) {
			stuck := cluster(t, []string{topic})
			p, err := kafka.New(kafka.Config{Brokers: stuck.ListenAddrs()})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			require.NoError(t, p.Send(ctx, producer.Batch{Topic: topic, Messages: msgs(topic, 1, 1, nil)}))
			reached := make(chan struct{}, 1)
			stuck.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				stuck.KeepControl()
				select {
				case reached <- struct{}{}:
				default:
				}
				return nil, nil, true // no answer
			})
			return p, reached
		},
	})
}

// received maps a record back to the outbox's fields.
func received(r *kgo.Record) producertest.Received {
	out := producertest.Received{PartitionKey: string(r.Key), Payload: r.Value, Headers: map[string]string{}}
	for _, h := range r.Headers {
		switch h.Key {
		case kafka.HeaderMessageID:
			out.MessageID = string(h.Value)
		case kafka.HeaderCorrelationID:
			out.CorrelationID = string(h.Value)
		case kafka.HeaderContentType:
			out.ContentType = string(h.Value)
		default:
			out.Headers[h.Key] = string(h.Value)
		}
	}
	return out
}
