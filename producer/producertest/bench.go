package producertest

import (
	"context"
	"runtime"
	"testing"

	"github.com/outbox-sweeper/sweeper/producer"
)

// BenchSend is a producer's BenchmarkSend: batches of 500 messages of 512
// bytes, each with a partition key (one of 10), a correlation id and two
// headers (a string and a number), cut by Batches and sent by Send as the
// sweeper does. It reports allocs/msg and B/msg, what this process allocates
// a message (the client library included), and msg/s, which says as much of
// the broker as of the producer.
func BenchSend(b *testing.B, p producer.Producer, topic string) {
	ctx := context.Background()
	ms := Messages(topic, 1, 500)
	for i := range ms {
		ms[i].Payload = make([]byte, 512)
		ms[i].Headers = []byte(`{"tenant":"acme","seq":12345}`)
		ms[i].CorrelationID = "corr"
		ms[i].PartitionKey = string(rune('a' + i%10))
	}
	send := func() {
		// Each sweep's rows come fresh from the database: nothing of a
		// previous send's mapping (Message.Prepared) is left on them.
		for i := range ms {
			ms[i].Prepared = nil
		}
		batches, err := p.Batches(ctx, topic, ms)
		if err != nil {
			b.Fatal(err)
		}
		for _, batch := range batches {
			if err := p.Send(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
	}
	send() // connected, the topic's limits read
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
