package memory_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
)

// The conformance suite against the memory producer, the test double: what it
// records is what a consumer would have received.
func TestConformance(t *testing.T) {
	t.Parallel()
	t.Run("all-or-nothing", func(t *testing.T) { conformance(t, false) })
	t.Run("partial", func(t *testing.T) { conformance(t, true) })
}

// conformance runs the suite; partial makes the double deliver the messages
// before a refused one (memory.Config.Partial), as NATS does.
func conformance(t *testing.T, partial bool) {
	var (
		mu        sync.Mutex
		producers []*memory.Producer
		topics    int
	)
	skip := map[string]string{
		producertest.CaseUnknownDestination: "a test double: every topic exists (FailTopic makes one fail with any class)",
		producertest.CaseBrokerDown:         "a test double: there is no broker (FailNextCalls makes sends fail with any class)",
		producertest.CaseCloseDuringSend:    "a test double: a send is held only by the SendFunc a test gives it, which decides when it ends",
	}
	if partial {
		skip[producertest.CaseAllOrNothing] = "Config.Partial delivers the messages before a refused one, and says so (the refused-mid-batch case)"
	}
	producertest.Run(t, producertest.Harness{
		New: func(*testing.T) producer.Producer {
			p := memory.New(memory.Config{MaxBatch: 50, Partial: partial})
			mu.Lock()
			defer mu.Unlock()
			producers = append(producers, p)
			return p
		},
		Topic: func(*testing.T) string {
			mu.Lock()
			defer mu.Unlock()
			topics++
			return "conformance." + string(rune('a'+topics))
		},
		Receive: func(t *testing.T, topic string, n int) []producertest.Received {
			mu.Lock()
			defer mu.Unlock()
			var out []producertest.Received
			for _, p := range producers {
				for _, m := range p.Messages() {
					if m.Topic == topic {
						out = append(out, producertest.Received{MessageID: m.MessageID, CorrelationID: m.CorrelationID,
							ContentType: m.ContentType, PartitionKey: m.PartitionKey, Payload: m.Payload,
							Headers: producertest.HeaderText(t, m.Headers)})
					}
				}
			}
			if len(out) < n {
				t.Fatalf("%d of %d messages of %s recorded", len(out), n, topic)
			}
			return out
		},
		Poison: func(_ *testing.T, p producer.Producer, m *producer.Message) {
			p.(*memory.Producer).FailMessage(m.ID, producer.NewMessageError(producer.ReasonMessageTooLarge, nil, errors.New("poisoned")))
		},
		Skip: skip,
	})
}
