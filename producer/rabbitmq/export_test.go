package rabbitmq

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-sweeper/sweeper/producer"
)

// SetAfterPublish lets tests break the connection between a batch's publishes
// and its confirms.
func SetAfterPublish(p *Producer, f func()) { p.afterPublish = f }

// CloseSocket closes the producer's socket under the AMQP client, as a network
// failure would.
func CloseSocket(p *Producer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.cork.Conn.Close()
}

// Conn returns the producer's connection, so tests can tell whether a send
// reconnected.
func Conn(p *Producer) *amqp.Connection {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn
}

// FrameMax returns the frame size rows are checked against.
func FrameMax(p *Producer) int { return p.frameMax() }

// HeaderFrameSize returns the size of the content header frame m would be
// published with, however large.
func HeaderFrameSize(m producer.Message) int {
	pre, _, err := publishing(&m, 1<<30, 1<<30)
	if err != nil {
		panic(err)
	}
	return headerFrameSize(&pre.pub)
}

// DropIdle closes the producer's idle channels, so that its next send opens
// one.
func DropIdle(p *Producer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.idle {
		_ = c.ch.Close()
	}
	p.idle = nil
}
