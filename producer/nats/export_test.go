package nats

import natsgo "github.com/nats-io/nats.go"

// Conn returns the producer's connection, so tests can tell whether a send
// reconnected.
func Conn(p *Producer) *natsgo.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nc
}

// SetMaxPayload sets the max_payload Batches uses while not connected, as if
// a server had said it.
func SetMaxPayload(p *Producer, n int64) { p.maxPayload.Store(n) }
