package nats

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	natsgo "github.com/nats-io/nats.go"

	"github.com/outbox-sweeper/sweeper/producer"
)

// NATS's limits on what a publish carries. A subject the server cannot parse,
// or a control line longer than it reads, makes it close the connection every
// topic shares (the client then prints "maximum control line exceeded" and
// reconnects), so both are refused before any send; so are header keys and
// values that would corrupt the header block.
const (
	// MaxControlLine is the longest protocol line the server reads: its
	// max_control_line, 4096 bytes unless configured otherwise (nats.go's
	// MAX_CONTROL_LINE_SIZE is the same default).
	MaxControlLine = natsgo.MAX_CONTROL_LINE_SIZE
	// controlLineOverhead is the rest of a JetStream publish's control line,
	// "HPUB <subject> <reply> <header size> <total size>\r\n", around the
	// subject: the verb and spaces (5 + 1 + 1 + 1), the reply inbox JetStream
	// sets ("_INBOX." + a 6-byte token + "." + a 6-byte id: 20 bytes), two
	// sizes of at most 10 digits each, and CRLF.
	controlLineOverhead = 5 + 1 + 20 + 1 + 10 + 1 + 10 + 2
	// MaxSubject is the longest subject a JetStream publish can carry within
	// MaxControlLine.
	MaxSubject = MaxControlLine - controlLineOverhead
)

// checkSubject refuses a topic no message could ever be published to: NATS
// subjects are UTF-8 tokens separated by dots, without whitespace (which ends a
// protocol field), and a publish names a literal subject, never a wildcard
// token ("*" or ">"). The server, unless pedantic, takes some of these and
// misroutes them; the others break the protocol line.
func checkSubject(topic string) error {
	err := subjectError(topic)
	if err == nil {
		return nil
	}
	return producer.NewTopicError("invalid_topic", fmt.Errorf("subject %s: %w: no message can be published to it", producer.Quote(topic), err))
}

func subjectError(s string) error {
	if s == "" {
		return fmt.Errorf("is empty")
	}
	if len(s) > MaxSubject {
		return fmt.Errorf("of %d bytes is over the %d bytes a subject can have in NATS's maximum control line of %d bytes (the PUB line holds the subject, a reply inbox and the sizes)",
			len(s), MaxSubject, MaxControlLine)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("is not valid UTF-8")
	}
	if i := strings.IndexAny(s, " \t\r\n"); i >= 0 {
		return fmt.Errorf("has whitespace (%q at byte %d), which ends a protocol field", s[i:i+1], i)
	}
	for i, tok := range strings.Split(s, ".") {
		switch tok {
		case "":
			return fmt.Errorf("has an empty token (token %d: a leading, trailing or doubled dot)", i+1)
		case "*", ">":
			return fmt.Errorf("has the wildcard token %q, which a publish cannot name", tok)
		}
	}
	return nil
}

// toMsg maps a message onto a NATS message, or says why it can never be
// published: a reason (a producer.Reason constant) and an error naming the
// row, the field and the rule. Batches and Send both call it, so both judge a
// row the same way. Batches keeps the message in m.Prepared, and Send takes
// a copy of it from there rather than decode the row's headers again: the
// message returned is the caller's to change (JetStream writes the message
// id into the header it publishes, and keeps the message for its retries,
// while a send again of the row may be under way). It writes nothing into m
// (producer.Message.Prepared).
func toMsg(m *producer.Message) (*natsgo.Msg, string, error) {
	if pm, ok := m.Prepared.(*natsgo.Msg); ok {
		msg := natsgo.NewMsg(pm.Subject)
		msg.Data = pm.Data
		for k, v := range pm.Header {
			msg.Header[k] = slices.Clone(v)
		}
		return msg, "", nil
	}
	msg := natsgo.NewMsg(m.Topic)
	msg.Data = m.Payload
	err := m.EachHeader(func(k string, v []byte) error {
		if err := checkHeaderKey(k); err != nil {
			return fmt.Errorf("row %d: header %s %w", m.ID, producer.Quote(k), err)
		}
		if len(k) >= 5 && strings.EqualFold(k[:5], "nats-") {
			// Nats-* headers steer JetStream itself (expected sequences,
			// rollups that purge a stream, TTLs): never from a row.
			return fmt.Errorf("row %d has header %s: Nats-* headers are reserved for the server", m.ID, producer.Quote(k))
		}
		s := string(v) // JSON text never holds a raw CR or LF
		if err := checkHeaderValue(s); err != nil {
			return fmt.Errorf("row %d: value of header %s %w", m.ID, producer.Quote(k), err)
		}
		msg.Header.Set(k, s)
		return nil
	})
	if err != nil {
		return nil, producer.ReasonInvalidMessage, err
	}
	for _, f := range []struct{ field, header, value string }{
		{"message_id", "Nats-Msg-Id", m.MessageID},
		{"content_type", headerContentType, m.ContentType},
		{"correlation_id", headerCorrelationID, m.CorrelationID},
		{"partition_key", headerPartitionKey, m.PartitionKey},
	} {
		if err := checkHeaderValue(f.value); err != nil {
			return nil, producer.ReasonInvalidMessage, fmt.Errorf("row %d: %s (sent as header %s) %w", m.ID, f.field, f.header, err)
		}
		if f.value != "" && f.header != "Nats-Msg-Id" { // jetstream.WithMsgID sets that one
			msg.Header.Set(f.header, f.value)
		}
	}
	return msg, "", nil
}

// checkHeaderKey refuses a header name that is not an RFC 7230 token:
// printable ASCII without separators. The header block is MIME-style lines
// of "Name: value", so a space, a colon or a control byte would break it;
// nats.go refuses the same set (ErrBadHeaderMsg) only once the publish is
// under way.
func checkHeaderKey(k string) error {
	if k == "" {
		return fmt.Errorf("has an empty name")
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c < 33 || c > 126 || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return fmt.Errorf("has %q at byte %d: a header name must be printable ASCII without spaces or separators (RFC 7230 token)", k[i:i+1], i)
		}
	}
	return nil
}

// checkHeaderValue refuses a value with a CR or LF, which would end its
// header line: nats.go would turn each into a space, so the consumer would
// get another value than the row holds.
func checkHeaderValue(v string) error {
	if i := strings.IndexAny(v, "\r\n"); i >= 0 {
		return fmt.Errorf("has %q at byte %d: a header value cannot hold a line break", v[i:i+1], i)
	}
	return nil
}
