package nats

import (
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// WatchAcks makes the connected producer call awaiting with a message's
// Nats-Msg-Id when a send starts waiting for that message's ack (Send's
// select asks the future for Ok first). A test that cancels, closes or
// changes the stream once the send waits for message k then knows the send
// took every ack before k: it cannot tell from outside, and a send that finds
// an ack and its end both ready picks one at random. It only observes: every
// call goes to the producer's own JetStream context.
func WatchAcks(p *Producer, awaiting func(msgID string)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.js = ackWatch{JetStream: p.js, awaiting: awaiting}
}

type ackWatch struct {
	jetstream.JetStream
	awaiting func(msgID string)
}

func (w ackWatch) PublishMsgAsync(m *natsgo.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	f, err := w.JetStream.PublishMsgAsync(m, opts...)
	if err != nil {
		return f, err
	}
	return watchedFuture{PubAckFuture: f, awaiting: w.awaiting}, nil
}

type watchedFuture struct {
	jetstream.PubAckFuture
	awaiting func(msgID string)
}

func (f watchedFuture) Ok() <-chan *jetstream.PubAck {
	f.awaiting(f.Msg().Header.Get(natsgo.MsgIdHdr))
	return f.PubAckFuture.Ok()
}
