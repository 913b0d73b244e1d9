package rabbitmq_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
	"github.com/outbox-sweeper/sweeper/producer/rabbitmq"
)

// inbox collects the deliveries of the queues bound for each topic.
type inbox struct {
	mu   sync.Mutex
	cond *sync.Cond
	got  map[string][]amqp.Delivery
}

// The conformance suite against RabbitMQ: an exchange of the test's own, a
// queue bound for each topic.
func TestConformance(t *testing.T) {
	t.Parallel()
	const maxMessageBytes = 65536
	amqpURL := brokertest.RabbitMQURL(t)
	exchange := brokertest.Name("outbox_conformance")
	ch := brokertest.RabbitMQExchange(t, amqpURL, exchange)
	in := &inbox{got: map[string][]amqp.Delivery{}}
	in.cond = sync.NewCond(&in.mu)
	var (
		chMu   sync.Mutex // amqp091 channels are not for concurrent use
		topics atomic.Int64
	)
	newProducer := func(t *testing.T, u string) *rabbitmq.Producer {
		p, err := rabbitmq.New(rabbitmq.Config{URL: u, Exchange: exchange, MaxMessageBytes: maxMessageBytes})
		require.NoError(t, err)
		return p
	}
	producertest.Run(t, producertest.Harness{
		New: func(t *testing.T) producer.Producer { return newProducer(t, amqpURL) },
		Topic: func(t *testing.T) string {
			topic := fmt.Sprintf("conformance.topic-%d", topics.Add(1))
			chMu.Lock()
			defer chMu.Unlock()
			q, err := ch.QueueDeclare("", false, true, true, false, nil)
			require.NoError(t, err)
			require.NoError(t, ch.QueueBind(q.Name, topic, exchange, false, nil))
			deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
			require.NoError(t, err)
			go func() {
				for d := range deliveries {
					in.mu.Lock()
					in.got[topic] = append(in.got[topic], d)
					in.cond.Broadcast()
					in.mu.Unlock()
				}
			}()
			return topic
		},
		Receive: func(t *testing.T, topic string, n int) []producertest.Received {
			stop := time.AfterFunc(time.Minute, func() { in.mu.Lock(); in.cond.Broadcast(); in.mu.Unlock() })
			defer stop.Stop()
			deadline := time.Now().Add(time.Minute)
			in.mu.Lock()
			for len(in.got[topic]) < n && time.Now().Before(deadline) {
				in.cond.Wait()
			}
			got := append([]amqp.Delivery(nil), in.got[topic]...)
			in.mu.Unlock()
			require.GreaterOrEqual(t, len(got), n, "deliveries of %s", topic)
			var out []producertest.Received
			for _, d := range got {
				r := producertest.Received{MessageID: d.MessageId, CorrelationID: d.CorrelationId, ContentType: d.ContentType,
					Payload: d.Body, Headers: map[string]string{}}
				for k, v := range d.Headers {
					if k == "partition_key" {
						r.PartitionKey = v.(string)
						continue
					}
					r.Headers[k] = fieldText(t, v)
				}
				out = append(out, r)
			}
			return out
		},
		Poison: func(_ *testing.T, _ producer.Producer, m *producer.Message) {
			m.Payload = make([]byte, maxMessageBytes+1)
		},
		// No queue is bound for it: RabbitMQ returns the message.
		Unknown: func(*testing.T) string { return "conformance.unbound" },
		Down: func(t *testing.T) producer.Producer {
			return newProducer(t, "amqp://guest:guest@"+producertest.ClosedAddr(t)+"/")
		},
		Stuck: func(t *testing.T, topic string) (producer.Producer, <-chan struct{}) {
			return producertest.Stalled(t, amqpURL, topic, func(t *testing.T, u string) producer.Producer { return newProducer(t, u) })
		},
	})
}

// fieldText writes an AMQP header value as the row's JSON had it.
func fieldText(t *testing.T, v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	j, err := json.Marshal(v)
	require.NoError(t, err)
	return string(j)
}
