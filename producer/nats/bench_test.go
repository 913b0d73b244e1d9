package nats_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	outboxnats "github.com/outbox-sweeper/sweeper/producer/nats"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
)

// BenchmarkSend (producertest.BenchSend) against the machine's NATS server,
// into a stream of the benchmark's own.
func BenchmarkSend(b *testing.B) {
	f := setup(b, outboxnats.Config{}, jetstream.StreamConfig{MaxMsgs: 100_000})
	producertest.BenchSend(b, f.p, f.subject("bench"))
}
