package rabbitmq

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-sweeper/sweeper/producer"
)

// AMQP 0-9-1's limits on what a publish carries. A row over one of them is
// refused before any send: amqp091 refuses an over-long short string only
// once the channel has the publish half written, and RabbitMQ answers a header
// frame over frame_max with FRAME_ERROR, which closes the connection every
// topic shares.
const (
	// shortStringMax is the longest AMQP short string (a length octet):
	// routing keys, message and correlation ids, content types, app ids and
	// header-table keys (AMQP 0-9-1 §4.2.5.3).
	shortStringMax = 255
	// frameMaxDefault is the frame size amqp091 proposes when not told
	// otherwise (its defaultFrameSize), which is also RabbitMQ's default
	// frame_max. Batches uses it before the first connection.
	frameMaxDefault = 131072
	// appID is what every publish carries as its app id.
	appID = "outbox-sweeper"
)

// checkRoutingKey refuses a topic no message could ever be published with: the
// routing key is a short string. RabbitMQ treats a routing key as bytes, so one
// that is not UTF-8 is routed (or returned) like any other.
func checkRoutingKey(topic string) error {
	if len(topic) > shortStringMax {
		return producer.NewTopicError("invalid_topic", fmt.Errorf(
			"routing key %s of %d bytes is over AMQP's short-string limit of %d bytes: no message can be published with it (use a shorter topic)",
			producer.Quote(topic), len(topic), shortStringMax))
	}
	return nil
}

// frameMax returns the frame size of the connection, as negotiated with the
// broker, or the one the client will propose when there is no connection.
func (p *Producer) frameMax() int {
	p.mu.Lock()
	conn := p.conn
	p.mu.Unlock()
	if conn != nil && conn.Config.FrameSize > 0 {
		return conn.Config.FrameSize
	}
	return frameMaxDefault
}

// publishing maps a message onto an AMQP publishing, or says why it can never
// be published: a reason (a producer.Reason constant) and an error naming the
// row, the field, its size and the limit. Batches and Send both call it, so
// both judge a row the same way. It returns what Batches built (m.Prepared)
// when there is one, and writes nothing into m (producer.Message.Prepared):
// a copy of its publishing is the caller's to change, but for its headers'
// table, which every copy shares.
func publishing(m *producer.Message, maxMessageBytes, frameMax int) (*prepared, string, error) {
	// What Batches built, checked against the frame size of its time: a
	// connection made since may allow smaller frames.
	if pre, ok := m.Prepared.(*prepared); ok && pre.headerFrame <= frameMax {
		return pre, "", nil
	}
	if len(m.Payload) > maxMessageBytes {
		return nil, producer.ReasonMessageTooLarge, fmt.Errorf(
			"row %d: payload of %d bytes is over RabbitMQ's limit of %d (max_message_size)", m.ID, len(m.Payload), maxMessageBytes)
	}
	headers, err := m.DecodeHeaders()
	if err != nil {
		return nil, producer.ReasonInvalidMessage, err
	}
	for _, f := range []struct{ name, value string }{
		{"message_id", m.MessageID},
		{"correlation_id", m.CorrelationID},
		{"content_type", m.ContentType},
	} {
		if len(f.value) > shortStringMax {
			return nil, producer.ReasonInvalidMessage, fmt.Errorf(
				"row %d: %s of %d bytes is over AMQP's short-string limit of %d bytes", m.ID, f.name, len(f.value), shortStringMax)
		}
	}
	table := amqp.Table(toTable(headers))
	if m.PartitionKey != "" {
		if table == nil {
			table = amqp.Table{}
		}
		table["partition_key"] = m.PartitionKey
	}
	if err := checkKeys(table, nil); err != nil {
		return nil, producer.ReasonInvalidMessage, fmt.Errorf("row %d: %w", m.ID, err)
	}
	for _, k := range []string{"CC", "BCC"} {
		// Sender-selected distribution: RabbitMQ routes a copy to each
		// routing key of an array in these headers, and closes the channel
		// (406 PRECONDITION_FAILED, unacceptable_type_in_header) for any
		// other type.
		if v, ok := table[k]; ok {
			if _, isArray := v.([]any); !isArray {
				return nil, producer.ReasonInvalidMessage, fmt.Errorf(
					"row %d: header %q is a %s: RabbitMQ takes it as a list of extra routing keys and accepts only an array", m.ID, k, jsonType(v))
			}
		}
	}
	if err := table.Validate(); err != nil {
		return nil, producer.ReasonInvalidMessage, fmt.Errorf("row %d: headers are not a valid AMQP table: %w", m.ID, err)
	}
	pub := amqp.Publishing{
		Headers:       table,
		ContentType:   m.ContentType,
		DeliveryMode:  amqp.Persistent,
		CorrelationId: m.CorrelationID,
		MessageId:     m.MessageID,
		Timestamp:     m.CreatedAt,
		AppId:         appID,
		Body:          m.Payload,
	}
	if !m.ExpiresAt.IsZero() {
		pub.Expiration = longestExpiration // set at the send; the frame counts its longest
	}
	size := headerFrameSize(&pub)
	pub.Expiration = ""
	if size > frameMax {
		return nil, producer.ReasonMessageTooLarge, fmt.Errorf(
			"row %d: headers of %d bytes make a content header frame of %d bytes, over the connection's frame_max of %d bytes "+
				"(AMQP sends the headers in one frame; RabbitMQ would close the connection with FRAME_ERROR)",
			m.ID, len(m.Headers), size, frameMax)
	}
	return &prepared{pub: pub, headerFrame: size}, "", nil
}

// prepared is a row's publishing as Batches built it (producer.Message's
// Prepared), so that Send does not decode the row's headers again, with the
// size of its content header frame. The expiration (the time left) is set
// at each send.
type prepared struct {
	pub         amqp.Publishing
	headerFrame int
}

// longestExpiration is the longest expiration a send sets: 292 years, in
// milliseconds.
const longestExpiration = "9223372036854"

// expiration returns the AMQP expiration of a message whose deadline is
// at (RabbitMQ's per-message TTL, in milliseconds as text): the time left,
// at least 1 ms (0 would let it through only to a consumer waiting at that
// moment); "" for no deadline.
func expiration(at, now time.Time) string {
	if at.IsZero() {
		return ""
	}
	return strconv.FormatInt(max(at.Sub(now).Milliseconds(), 1), 10)
}

// jsonType names the JSON type a header value came from.
func jsonType(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case bool:
		return "boolean"
	case nil:
		return "null"
	case amqp.Table:
		return "object"
	default:
		return "number"
	}
}

// checkKeys refuses a table whose keys, at any depth (tables nested in tables
// or in arrays), are over the short-string limit. path names the enclosing
// keys for the error.
func checkKeys(t amqp.Table, path []string) error {
	for k, v := range t {
		if len(k) > shortStringMax {
			return fmt.Errorf("header key %s of %d bytes is over AMQP's short-string limit of %d bytes",
				headerPath(path, k), len(k), shortStringMax)
		}
		if err := checkFieldKeys(v, append(path[:len(path):len(path)], k)); err != nil {
			return err
		}
	}
	return nil
}

func checkFieldKeys(v any, path []string) error {
	switch x := v.(type) {
	case amqp.Table:
		return checkKeys(x, path)
	case []any:
		for i := range x {
			if err := checkFieldKeys(x[i], append(path[:len(path):len(path)], fmt.Sprintf("[%d]", i))); err != nil {
				return err
			}
		}
	}
	return nil
}

// headerPath names a nested key as outer.inner, each part cut short.
func headerPath(path []string, key string) string {
	parts := make([]string, 0, len(path)+1)
	for _, p := range path {
		parts = append(parts, producer.Quote(p))
	}
	parts = append(parts, producer.Quote(key))
	return strings.Join(parts, ".")
}

// Sizes of the content header frame, as amqp091 writes it (write.go,
// headerFrame.write and writeFrame): a frame of type, channel and payload
// size (7 bytes) and a frame-end octet; a payload of class id, weight, body
// size and property flags (14 bytes), then each property that is set.
const (
	frameEnvelope    = 7 + 1
	headerFixed      = 2 + 2 + 8 + 2
	timestampSize    = 8
	deliveryModeSize = 1
	prioritySize     = 1
)

// headerFrameSize returns the size of the content header frame that carries
// pub's properties, envelope included, which AMQP bounds by frame_max; the
// header frame, unlike the body, is never split. (RabbitMQ 3.10 was seen to
// take frames up to 8 bytes larger, and to close the connection with
// FRAME_ERROR frame_too_large past that; the producer keeps to the spec.)
func headerFrameSize(pub *amqp.Publishing) int {
	n := frameEnvelope + headerFixed
	for _, s := range []string{pub.ContentType, pub.ContentEncoding, pub.CorrelationId, pub.ReplyTo,
		pub.Expiration, pub.MessageId, pub.Type, pub.UserId, pub.AppId} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if len(pub.Headers) > 0 {
		n += tableSize(pub.Headers)
	}
	if pub.DeliveryMode > 0 {
		n += deliveryModeSize
	}
	if pub.Priority > 0 {
		n += prioritySize
	}
	if !pub.Timestamp.IsZero() {
		n += timestampSize
	}
	return n
}

// tableSize returns the encoded size of a field table: a 4-byte length, then
// each key as a short string and its value as a field (write.go, writeTable).
func tableSize(t amqp.Table) int {
	n := 4
	for k, v := range t {
		n += 1 + len(k) + fieldSize(v)
	}
	return n
}

// fieldSize returns the encoded size of one field value, type octet included
// (write.go, writeField). A type amqp091 cannot encode counts as larger than
// any frame (toTable makes none, and Table.Validate refuses it anyway).
func fieldSize(v any) int {
	switch x := v.(type) {
	case nil:
		return 1
	case bool, byte, int8:
		return 2
	case int16, uint16:
		return 3
	case int, int32, uint32, float32:
		return 5
	case amqp.Decimal:
		return 6
	case int64, float64, time.Time:
		return 9
	case string:
		return 5 + len(x)
	case []byte:
		return 5 + len(x)
	case []any:
		n := 5
		for i := range x {
			n += fieldSize(x[i])
		}
		return n
	case amqp.Table:
		return 1 + tableSize(x)
	default:
		return 1 << 30
	}
}
