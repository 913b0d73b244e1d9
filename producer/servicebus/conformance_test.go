package servicebus

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
)

// namespace is a fake Service Bus namespace for the conformance suite: its
// entities, what they received, and a state for the cases of a namespace that
// is down or that stops answering. Safe for the suite's parallel cases.
type namespace struct {
	maxBytes int
	mu       sync.Mutex
	entities map[string][]*azservicebus.Message
}

// nsSender is a sender of one entity of a namespace.
type nsSender struct {
	ns      *namespace
	entity  string
	down    bool
	stuck   atomic.Bool
	reached chan struct{}
	closed  chan struct{}
	once    sync.Once
}

func (s *nsSender) NewMessageBatch(context.Context) (messageBatch, error) {
	if s.down {
		return nil, &azservicebus.Error{Code: azservicebus.CodeConnectionLost}
	}
	s.ns.mu.Lock()
	_, ok := s.ns.entities[s.entity]
	s.ns.mu.Unlock()
	if !ok {
		return nil, &azservicebus.Error{Code: azservicebus.CodeNotFound}
	}
	return &fakeBatch{maxBytes: s.ns.maxBytes}, nil
}

func (s *nsSender) SendMessageBatch(ctx context.Context, b messageBatch) error {
	if s.stuck.Load() {
		select {
		case s.reached <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closed:
			return &azservicebus.Error{Code: azservicebus.CodeClosed}
		}
	}
	s.ns.mu.Lock()
	defer s.ns.mu.Unlock()
	s.ns.entities[s.entity] = append(s.ns.entities[s.entity], b.(*fakeBatch).msgs...)
	return nil
}

func (s *nsSender) Close(context.Context) error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

// The conformance suite through the fake namespace: what it proves is the
// producer's side (mapping, cutting, classes, Close); the service's own
// answers are docs/producers.md's "Needs a real namespace" (under "Azure
// Service Bus").
func TestConformance(t *testing.T) {
	t.Parallel()
	ns := &namespace{maxBytes: 65536, entities: map[string][]*azservicebus.Message{}}
	var topics atomic.Int64
	newSender := func(down bool, stuck func(*nsSender)) func(string) (sender, error) {
		return func(entity string) (sender, error) {
			s := &nsSender{ns: ns, entity: entity, down: down, reached: make(chan struct{}, 1), closed: make(chan struct{})}
			if stuck != nil {
				stuck(s)
			}
			return s, nil
		}
	}
	producertest.Run(t, producertest.Harness{
		New: func(*testing.T) producer.Producer { return newProducer(Config{}, newSender(false, nil)) },
		Topic: func(*testing.T) string {
			topic := fmt.Sprintf("conformance-%d", topics.Add(1))
			ns.mu.Lock()
			defer ns.mu.Unlock()
			ns.entities[topic] = nil
			return topic
		},
		Receive: func(t *testing.T, topic string, n int) []producertest.Received {
			ns.mu.Lock()
			got := append([]*azservicebus.Message(nil), ns.entities[topic]...)
			ns.mu.Unlock()
			require.GreaterOrEqual(t, len(got), n, "messages of %s", topic)
			var out []producertest.Received
			for _, m := range got {
				r := producertest.Received{Payload: m.Body, Headers: map[string]string{}}
				for _, f := range []struct {
					dst *string
					src *string
				}{{&r.MessageID, m.MessageID}, {&r.CorrelationID, m.CorrelationID}, {&r.ContentType, m.ContentType}, {&r.PartitionKey, m.SessionID}} {
					if f.src != nil {
						*f.dst = *f.src
					}
				}
				for k, v := range m.ApplicationProperties {
					if s, ok := v.(string); ok {
						r.Headers[k] = s
						continue
					}
					j, err := json.Marshal(v)
					require.NoError(t, err)
					r.Headers[k] = string(j)
				}
				out = append(out, r)
			}
			return out
		},
		Poison:  func(_ *testing.T, _ producer.Producer, m *producer.Message) { m.Payload = make([]byte, ns.maxBytes) },
		Unknown: func(*testing.T) string { return "conformance-missing" },
		Down:    func(*testing.T) producer.Producer { return newProducer(Config{}, newSender(true, nil)) },
		Stuck: func(t *testing.T, topic string) (producer.Producer, <-chan struct{}) {
			reached := make(chan struct{}, 1)
			var senders []*nsSender
			var mu sync.Mutex
			p := newProducer(Config{}, newSender(false, func(s *nsSender) {
				s.reached = reached
				mu.Lock()
				senders = append(senders, s)
				mu.Unlock()
			}))
			require.NoError(t, p.Send(context.Background(), producer.Batch{Topic: topic, Messages: producertest.Messages(topic, 1, 1)}))
			mu.Lock()
			for _, s := range senders {
				s.stuck.Store(true)
			}
			mu.Unlock()
			return p, reached
		},
	})
}
