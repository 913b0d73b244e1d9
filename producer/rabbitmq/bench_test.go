package rabbitmq_test

import (
	"testing"

	"github.com/outbox-sweeper/sweeper/producer/producertest"
	"github.com/outbox-sweeper/sweeper/producer/rabbitmq"
)

// BenchmarkSend (producertest.BenchSend) against the machine's RabbitMQ,
// with a queue bound to the topic (a queue of at most 100,000 messages,
// which drops the oldest), so that every message is routed and confirmed.
func BenchmarkSend(b *testing.B) {
	f := setup(b, rabbitmq.Config{})
	f.bindOnly(b, "bench", map[string]any{"x-max-length": 100_000})
	producertest.BenchSend(b, f.p, "bench")
}
