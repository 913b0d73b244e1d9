package kafka_test

import (
	"context"
	"testing"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/producer/kafka"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
)

// BenchmarkSend (producertest.BenchSend) against a kfake cluster running as
// a process of its own (test/kfakeserver), so that what this process
// allocates is the producer's (franz-go included) alone. Its msg/s says how
// fast kfake is, not a Kafka cluster; there is no target.
func BenchmarkSend(b *testing.B) {
	addr := brokertest.StartKafka(b, "--topics", "bench", "--partitions", "3").Addr
	p, err := kafka.New(kafka.Config{Brokers: []string{addr}})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(context.Background())
	producertest.BenchSend(b, p, "bench")
}
