package nats

import (
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
)

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

// SetStreamsClock sets the clock the stream list's ages are read on.
func SetStreamsClock(p *Producer, now func() time.Time) {
	p.streams.mu.Lock()
	defer p.streams.mu.Unlock()
	p.streams.now = now
}

// Matches exposes matches to the tests, on subjects as strings.
func Matches(filter, subject string) bool {
	return matches(strings.Split(filter, "."), strings.Split(subject, "."))
}
