package kafka

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-sweeper/sweeper/producer"
)

// Headers the producer sets from the row's columns. A row's own header of
// the same name (in any case) is refused: a consumer would see two values.
const (
	HeaderMessageID     = "message-id"
	HeaderCorrelationID = "correlation-id"
	HeaderContentType   = "content-type"
)

// MaxTopicLength is the longest topic name Kafka accepts (249 characters, so
// that a partition's directory name fits in 255 bytes).
const MaxTopicLength = 249

// checkTopic refuses a topic name Kafka can never accept: the broker answers
// INVALID_TOPIC_EXCEPTION, or, on clusters that create topics on first use,
// fails the metadata request. Kafka's rule: 1 to 249 characters of ASCII
// letters, digits, '.', '_' and '-', and not "." or "..".
func checkTopic(topic string) error {
	err := topicError(topic)
	if err == nil {
		return nil
	}
	return producer.NewTopicError("invalid_topic", fmt.Errorf("Kafka topic %s %w: no record can be produced to it (a topic name is 1 to %d of a-z A-Z 0-9 . _ -)",
		producer.Quote(topic), err, MaxTopicLength))
}

func topicError(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("is empty")
	case s == "." || s == "..":
		return fmt.Errorf("is %q, which Kafka reserves", s)
	case len(s) > MaxTopicLength:
		return fmt.Errorf("has %d characters, over Kafka's %d", len(s), MaxTopicLength)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			r, _ := utf8.DecodeRuneInString(s[i:])
			return fmt.Errorf("has %q at byte %d", r, i)
		}
	}
	return nil
}

// toRecord maps a message onto a Kafka record for topic, or says why it can
// never be produced: a reason (a producer.Reason constant) and an error naming
// the row, the field and the rule. Batches and Send both call it, so both
// judge a row the same way.
//
// The partition key is the record key (nil without one: the partitioner then
// spreads the rows over the partitions); the row's headers follow the three
// the producer sets, strings as they are and other JSON values as their JSON
// text.
//
// It returns the record Batches built (m.Prepared) when there is one, so
// that a row's headers are decoded once a send, and writes nothing into m
// (producer.Message.Prepared). The caller must not give the same record to
// two produce calls: franz-go keeps a produce's state in it (its context
// among them); Send produces a copy.
func toRecord(topic string, m *producer.Message) (*kgo.Record, string, error) {
	if r, ok := m.Prepared.(*kgo.Record); ok && r.Topic == topic {
		return r, "", nil
	}
	// Three headers from columns, and at most one a colon of the column.
	r := &kgo.Record{Topic: topic, Value: m.Payload, Headers: make([]kgo.RecordHeader, 0, 3+bytes.Count(m.Headers, colon))}
	if m.PartitionKey != "" {
		r.Key = []byte(m.PartitionKey)
	}
	for _, h := range []struct{ key, value string }{
		{HeaderMessageID, m.MessageID},
		{HeaderCorrelationID, m.CorrelationID},
		{HeaderContentType, m.ContentType},
	} {
		if h.value != "" {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.key, Value: []byte(h.value)})
		}
	}
	// The row's headers go as they are in the column (EachHeader): their
	// values alias the row's bytes, which nothing changes.
	err := m.EachHeader(func(k string, v []byte) error {
		if k == "" {
			return producer.NewMessageError(producer.ReasonInvalidMessage, []int64{m.ID}, fmt.Errorf("row %d has a header with an empty name", m.ID))
		}
		for _, reserved := range []string{HeaderMessageID, HeaderCorrelationID, HeaderContentType} {
			if strings.EqualFold(k, reserved) {
				return producer.NewMessageError(producer.ReasonInvalidMessage, []int64{m.ID}, fmt.Errorf(
					"row %d has header %s: the sweeper sets %s from the row's own column; drop the header from the row", m.ID, producer.Quote(k), reserved))
			}
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: v})
		return nil
	})
	if err != nil {
		return nil, producer.ReasonInvalidMessage, err
	}
	return r, "", nil
}

// colon counts the row's headers' upper bound in toRecord: each has one.
var colon = []byte(":")

// recordBatchOverhead is the size of a record batch's header (v2): what a
// batch of one record adds to the record.
const recordBatchOverhead = 61

// recordSize is an upper bound of a record's size inside a record batch,
// uncompressed: the key, the value, each header's key and value, and the
// varints around them (at most 5 bytes each for these lengths, 10 for the
// timestamp delta).
func recordSize(r *kgo.Record) int {
	n := 1 + 5 + 10 + 5 + 5 + len(r.Key) + 5 + len(r.Value) + 5 // length, attributes, timestamp delta, offset delta, key, value, header count
	for _, h := range r.Headers {
		n += 5 + len(h.Key) + 5 + len(h.Value)
	}
	return n
}
