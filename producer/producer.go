// Package producer defines what the sweeper needs from a message broker: a bulk
// producer that cuts a topic's messages into batches the broker accepts and sends
// one batch at a time, and the failure classes every producer reports.
//
// The interface follows the outbox ADR: cutting and sending are separate calls so
// that the sweeper, which claims a page of rows in one transaction, can send each
// batch and record its outcome on its own. A failed batch then never undoes an
// earlier one, and each batch can be retried by itself.
//
// This package does not import the outbox package; the sweeper maps its rows onto
// [Message]. One sub-package per broker implements [Producer].
package producer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Message is one outbox row as a producer sees it. Payload and Headers are the
// bytes stored in the table: producers pass them on without re-encoding.
type Message struct {
	// ID is the outbox row's id. Message-class errors name rows by it.
	ID int64
	// MessageID is the row's idempotency key (a UUID in text form). Producers send
	// it as the broker's message id so that brokers with duplicate detection drop
	// a redelivery.
	MessageID string
	// Topic is the destination: a Service Bus entity, a RabbitMQ routing key, a
	// NATS subject.
	Topic string
	// Payload is the opaque body.
	Payload []byte
	// Headers is the row's headers column: a JSON object, "{}" when there are none.
	Headers json.RawMessage
	// ContentType, CorrelationID and PartitionKey are empty when the row holds NULL.
	ContentType   string
	CorrelationID string
	PartitionKey  string
	// CreatedAt is when the application wrote the row (the start of its
	// transaction), or when an operator replayed it from the dead letters.
	CreatedAt time.Time
	// ExpiresAt is the row's deadline, zero for none: its own (the
	// expires_at column), or its topic's max age (--max-age) counted from
	// CreatedAt when that comes first. The sweeper never sends a row past
	// it; RabbitMQ and Service Bus pass the time left on as the message's
	// time to live (expiration, TimeToLive). Kafka and NATS have no such
	// field.
	ExpiresAt time.Time
	// Attempts counts the failed dispatches before this one.
	Attempts int
	// Prepared is the producer's own form of the message (a Kafka record,
	// say), which Batches may set on the messages it is given, having built
	// it to measure or check the message: the sweeper hands Send the
	// messages of a batch, or some of them, as Batches left them, so Send
	// need not build it again. Send builds it when it is nil, for itself:
	// Send writes nothing into the messages it is given, nor into what
	// Batches built, since its caller may read them, or send them again,
	// while it sends (the conformance suite's send-writes-nothing). Only
	// the producer that set it reads it.
	Prepared any
}

// DecodeHeaders returns the headers as a map. An empty or "{}" column gives a nil
// map. Numbers come back as json.Number, so a 64-bit id in a header keeps every
// digit (float64 would round it past 2^53); [HeaderNumber] converts one. Headers
// that are not a JSON object give a message-class error, since the row can never
// be sent as it is.
func (m *Message) DecodeHeaders() (map[string]any, error) {
	if len(m.Headers) == 0 || string(m.Headers) == "{}" {
		return nil, nil
	}
	var h map[string]any
	dec := json.NewDecoder(bytes.NewReader(m.Headers))
	dec.UseNumber()
	if err := dec.Decode(&h); err != nil || h == nil {
		if err == nil {
			err = errors.New("null")
		}
		return nil, NewMessageError(ReasonInvalidMessage, []int64{m.ID},
			fmt.Errorf("headers of row %d are not a JSON object: %w", m.ID, err))
	}
	return h, nil
}

// HeaderNumber converts a JSON number from [Message.DecodeHeaders] to an int64
// when it is a whole number that fits, to its JSON text (a string) when it is a
// whole number that does not (a float64 would round 12345678901234567890 to
// 12345678901234567000), else to a float64.
func HeaderNumber(n json.Number) any {
	if i, err := n.Int64(); err == nil {
		return i
	}
	if !strings.ContainsAny(string(n), ".eE") {
		return string(n)
	}
	f, _ := n.Float64() // json.Number is always a valid number
	return f
}

// Batch is a run of messages of one topic, in id order, that the broker accepts in
// one call.
type Batch struct {
	Topic    string
	Messages []Message
}

// IDs returns the row ids of the batch's messages, in order.
func (b Batch) IDs() []int64 {
	ids := make([]int64, len(b.Messages))
	for i := range b.Messages {
		ids[i] = b.Messages[i].ID
	}
	return ids
}

// Producer sends outbox messages to a broker in batches.
//
// The sweeper calls Batches once per topic and page, then Send for each batch in
// order, from one goroutine per topic; different topics are sent concurrently, so
// implementations must be safe for concurrent use across topics.
type Producer interface {
	// Batches cuts msgs, all of one topic and in id order, into batches the broker
	// accepts, keeping the order. When some messages can never be sent (too large
	// for an empty batch, say), Batches leaves them out, returns the rest, and
	// returns a message-class error naming the rows it left out. Any other error
	// means nothing of the topic is sent this time.
	Batches(ctx context.Context, topic string, msgs []Message) ([]Batch, error)

	// Send sends one batch. The batch may be any subsequence of one that Batches
	// returned (the sweeper drops rows another instance has claimed meanwhile), so
	// Send must build its broker request from the messages it is given. A nil
	// error means the broker has accepted every message of the batch.
	Send(ctx context.Context, b Batch) error

	// Close releases the producer's connections. The sweeper calls it once, after
	// its last Send.
	Close(ctx context.Context) error
}

// Checker is a producer that can tell cheaply whether its broker is up: a
// round trip that involves no message, such as a passive declare or a flush.
// The sweeper asks it after a failed send that named no row, and blames the
// rows only when it passes: a row is charged only when it failed while the
// broker was known to be up.
type Checker interface {
	// Check returns nil when the broker answers within ctx.
	Check(ctx context.Context) error
}

// TopicChecker is a producer that can tell, without sending anything and in
// about a microsecond, that no message can reach a topic: NATS knows the
// subjects its streams capture. The sweeper asks it about each topic it is
// about to read rows of, and trips a topic it refuses without claiming a row:
// a flood of such topics (an application writing an id as the topic) then
// costs the sweeper no page, and the topics that work keep their pace.
type TopicChecker interface {
	// CheckTopic returns a topic-class error when no message can reach topic,
	// and nil when one may, or when it cannot tell without a round trip.
	CheckTopic(ctx context.Context, topic string) error
}
