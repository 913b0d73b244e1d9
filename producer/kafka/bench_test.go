package kafka_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/producer/kafka"
)

// BenchmarkSend produces batches of 500 records of 512 bytes, each with a key
// of 10 and two headers, to a kfake cluster running as a process of its own
// (test/kfakeserver), so that what this process allocates is the producer's
// (franz-go included) alone: allocs/msg and B/msg. Its msg/s says how fast
// kfake is, not a Kafka cluster; there is no target.
func BenchmarkSend(b *testing.B) {
	addr := brokertest.StartKafka(b, "--topics", "bench", "--partitions", "3").Addr
	p, err := kafka.New(kafka.Config{Brokers: []string{addr}})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(context.Background())
	ctx := context.Background()
	ms := msgs("bench", 1, 500, func(i int) string { return []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}[i%10] })
	for i := range ms {
		ms[i].Payload = make([]byte, 512)
		ms[i].Headers = []byte(`{"tenant":"acme","seq":12345}`)
		ms[i].CorrelationID = "corr"
	}
	send := func() {
		batches, err := p.Batches(ctx, "bench", ms)
		if err != nil {
			b.Fatal(err)
		}
		for _, batch := range batches {
			if err := p.Send(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
	}
	send() // connected, the topic's limit read
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for range b.N {
		send()
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	n := float64(b.N * len(ms))
	b.ReportMetric(n/b.Elapsed().Seconds(), "msg/s")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/n, "allocs/msg")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/n, "B/msg")
}
