package servicebus

import (
	"encoding/json"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/outbox-sweeper/sweeper/producer"
)

// Service Bus's limits on a message's properties, from the "Messaging quotas"
// table of https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas
// (limits common to all tiers), and the AMQP 1.0 types the SDK sends them as.
// The SDK checks none of them: the service refuses the message (a
// SerializationException), which arrives as an error the producer cannot pin
// on a row, so the whole batch would fail again and again.
//
// Lengths in "characters" are counted as .NET counts them (UTF-16 code units),
// since that is what the service measures.
const (
	// maxEntityPath: "Maximum size of any messaging entity path: queue or
	// topic: 260 characters."
	maxEntityPath = 260
	// maxMessageID: "Maximum size of a message ID: 128."
	maxMessageID = 128
	// maxSessionID: "Maximum size of a message session ID: 128." The
	// partition key is sent as the session id.
	maxSessionID = 128
	// maxPropertyBytes: "Maximum message property size for each property is
	// 32 KB."
	maxPropertyBytes = 32 << 10
	// maxHeaderBytes: "Cumulative size of all properties can't exceed 64 KB.
	// This limit applies to the entire header of the brokered message, which
	// has both user properties and system properties, such as sequence number,
	// label, and message ID." The producer counts what it sets and keeps
	// headerReserve for the properties the service adds itself.
	maxHeaderBytes = 64 << 10
	headerReserve  = 1 << 10
)

// checkEntity refuses a topic no message could ever be sent to: an entity path
// over the service's limit, or not UTF-8 (AMQP 1.0 sends the address as a
// string, which is UTF-8: OASIS AMQP 1.0 part 1, §1.6.20).
func checkEntity(topic string) error {
	var err error
	switch {
	case topic == "":
		err = fmt.Errorf("entity path is empty")
	case !utf8.ValidString(topic):
		err = fmt.Errorf("entity path %s is not valid UTF-8, which AMQP requires", producer.Quote(topic))
	case utf16Len(topic) > maxEntityPath:
		err = fmt.Errorf("entity path %s of %d characters is over Service Bus's limit of %d characters",
			producer.Quote(topic), utf16Len(topic), maxEntityPath)
	default:
		return nil
	}
	return producer.NewTopicError("invalid_topic", fmt.Errorf("%w: no message can be sent to it", err))
}

// toMessage maps an outbox message onto a Service Bus message, or says why it
// can never be sent: a reason (a producer.Reason constant) and an error naming
// the row, the field, its size and the limit. Batches and Send both call it.
// The message returned is the caller's to change: a copy of what Batches
// built (m.Prepared) when there is one. It writes nothing into m
// (producer.Message.Prepared).
func toMessage(m *producer.Message) (*azservicebus.Message, string, error) {
	if pm, ok := m.Prepared.(*azservicebus.Message); ok {
		c := *pm // what Batches built; a send sets its own time to live
		return &c, "", nil
	}
	headers, err := m.DecodeHeaders()
	if err != nil {
		return nil, producer.ReasonInvalidMessage, err
	}
	for _, f := range []struct {
		name  string
		value string
		max   int // characters; 0: only the property limit
	}{
		{"message_id", m.MessageID, maxMessageID},
		{"partition_key (sent as the session id)", m.PartitionKey, maxSessionID},
		{"correlation_id", m.CorrelationID, 0},
		{"content_type", m.ContentType, 0},
	} {
		switch {
		case !utf8.ValidString(f.value):
			return nil, producer.ReasonInvalidMessage, fmt.Errorf("row %d: %s is not valid UTF-8, which AMQP requires", m.ID, f.name)
		case f.max > 0 && utf16Len(f.value) > f.max:
			return nil, producer.ReasonInvalidMessage, fmt.Errorf("row %d: %s of %d characters is over Service Bus's limit of %d characters",
				m.ID, f.name, utf16Len(f.value), f.max)
		case len(f.value) > maxPropertyBytes:
			return nil, producer.ReasonMessageTooLarge, fmt.Errorf("row %d: %s of %d bytes is over Service Bus's limit of %d bytes for one property",
				m.ID, f.name, len(f.value), maxPropertyBytes)
		}
	}
	// AMQP 1.0 sends the content type as a symbol, which is ASCII (OASIS AMQP
	// 1.0 part 1, §1.6.21).
	for i := 0; i < len(m.ContentType); i++ {
		if m.ContentType[i] >= utf8.RuneSelf {
			return nil, producer.ReasonInvalidMessage, fmt.Errorf(
				"row %d: content_type has a non-ASCII byte at %d: AMQP sends it as a symbol, which is ASCII", m.ID, i)
		}
	}
	// The partition key goes out twice, as the session id and the partition
	// key (see toMessage's return).
	header := len(m.MessageID) + 2*len(m.PartitionKey) + len(m.CorrelationID) + len(m.ContentType)

	var props map[string]any
	if len(headers) > 0 {
		props = make(map[string]any, len(headers))
		for k, v := range headers {
			var value any
			switch x := v.(type) {
			case string, bool:
				value = x
			case json.Number:
				value = producer.HeaderNumber(x)
			case nil:
				// A null header carries nothing an application property can hold.
				continue
			default:
				j, err := json.Marshal(x)
				if err != nil {
					return nil, producer.ReasonInvalidMessage, fmt.Errorf("row %d: header %s: %w", m.ID, producer.Quote(k), err)
				}
				value = string(j)
			}
			size := propertySize(k, value)
			if size > maxPropertyBytes {
				return nil, producer.ReasonMessageTooLarge, fmt.Errorf(
					"row %d: header %s of %d bytes is over Service Bus's limit of %d bytes for one property",
					m.ID, producer.Quote(k), size, maxPropertyBytes)
			}
			header += size
			props[k] = value
		}
	}
	if header > maxHeaderBytes-headerReserve {
		return nil, producer.ReasonMessageTooLarge, fmt.Errorf(
			"row %d: properties of about %d bytes (headers, ids, content type) are over the %d bytes Service Bus allows for a message's header "+
				"(64 KB, less %d bytes for the properties the service adds)",
			m.ID, header, maxHeaderBytes-headerReserve, headerReserve)
	}
	sb := &azservicebus.Message{
		MessageID:             new(m.MessageID), // not &m.MessageID: the message outlives m's slice, which its caller may reuse
		Body:                  m.Payload,
		ApplicationProperties: props,
		ContentType:           optional(m.ContentType),
		CorrelationID:         optional(m.CorrelationID),
		// Both, equal: a session-enabled entity needs the session id, a
		// partitioned one the partition key, and the service refuses a message
		// whose two differ.
		SessionID:    optional(m.PartitionKey),
		PartitionKey: optional(m.PartitionKey),
	}
	return sb, "", nil
}

// propertySize is an application property's size as encoded: its key and
// value, strings by their bytes and numbers and booleans at their widest.
func propertySize(k string, v any) int {
	n := len(k)
	if s, ok := v.(string); ok {
		return n + len(s)
	}
	return n + 9
}

// utf16Len returns the length of s in UTF-16 code units, as .NET counts a
// string's characters.
func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		n += utf16.RuneLen(r)
	}
	return n
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
