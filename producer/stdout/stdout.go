// Package stdout is a producer that writes each message as one line of JSON. It is
// the sweeper's default, so that a new user sees the relay work with nothing but
// Postgres installed, and it pipes well into jq.
//
// A line looks like:
//
//	{"id":1,"message_id":"0b9…","topic":"orders","correlation_id":null,"headers":{},"payload":"aGk="}
//
// The payload is base64, since it is opaque bytes; headers are the stored JSON.
package stdout

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"

	"github.com/outbox-sweeper/sweeper/producer"
)

// MaxBatchDefault is the default for [Config.MaxBatch].
const MaxBatchDefault = 500

// Config configures a [Producer].
type Config struct {
	// MaxBatch is the most messages written by one Send. Defaults to
	// MaxBatchDefault.
	MaxBatch int
}

// Producer writes messages to an io.Writer, one JSON object per line. A batch is
// written with one Write call, so lines of concurrent batches never interleave.
type Producer struct {
	maxBatch int

	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

var (
	_ producer.Producer = (*Producer)(nil)
	_ producer.Checker  = (*Producer)(nil)
)

// New returns a producer writing to w (os.Stdout in the binary).
func New(w io.Writer, cfg Config) *Producer {
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = MaxBatchDefault
	}
	return &Producer{w: w, maxBatch: cfg.MaxBatch}
}

// Batches cuts msgs into runs of at most MaxBatch messages. A row whose headers
// are not valid JSON is left out and named in a message-class error, since its
// line could not be parsed downstream. Any topic will do: the line quotes it as
// JSON, which replaces bytes that are not UTF-8.
func (p *Producer) Batches(_ context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	var rej producer.Rejections
	valid := rej.Keep(msgs, checkHeaders)
	out := make([]producer.Batch, 0, (len(valid)+p.maxBatch-1)/p.maxBatch)
	for chunk := range slices.Chunk(valid, p.maxBatch) {
		out = append(out, producer.Batch{Topic: topic, Messages: chunk})
	}
	return out, rej.Err()
}

// Send writes the batch's lines. It checks the headers again, as Batches does,
// and writes nothing when it refuses a row.
func (p *Producer) Send(ctx context.Context, b producer.Batch) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var rej producer.Rejections
	rej.Keep(b.Messages, checkHeaders)
	if err := rej.Err(); err != nil {
		return err
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	buf := p.buf[:0]
	for _, m := range b.Messages {
		buf = appendLine(buf, &m)
	}
	p.buf = buf
	if _, err := p.w.Write(buf); err != nil {
		return fmt.Errorf("write %d messages of topic %q: %w", len(b.Messages), b.Topic, err)
	}
	if f, ok := p.w.(*bufio.Writer); ok {
		if err := f.Flush(); err != nil {
			return fmt.Errorf("flush %d messages of topic %q: %w", len(b.Messages), b.Topic, err)
		}
	}
	return nil
}

// checkHeaders refuses headers that are not valid JSON.
func checkHeaders(m *producer.Message) (string, error) {
	if len(m.Headers) > 0 && !json.Valid(m.Headers) {
		return producer.ReasonInvalidMessage, fmt.Errorf("row %d: headers are not valid JSON", m.ID)
	}
	return "", nil
}

// Check always passes: writing to a local stream needs no broker.
func (p *Producer) Check(context.Context) error { return nil }

// Close does nothing: the writer belongs to the caller.
func (p *Producer) Close(context.Context) error { return nil }

// appendLine appends m's JSON line by hand: encoding/json would re-encode the
// headers and allocate per message, and this is the demo's hot path.
func appendLine(buf []byte, m *producer.Message) []byte {
	buf = append(buf, `{"id":`...)
	buf = strconv.AppendInt(buf, m.ID, 10)
	buf = append(buf, `,"message_id":`...)
	buf = appendJSONString(buf, m.MessageID)
	buf = append(buf, `,"topic":`...)
	buf = appendJSONString(buf, m.Topic)
	buf = append(buf, `,"correlation_id":`...)
	if m.CorrelationID == "" {
		buf = append(buf, "null"...)
	} else {
		buf = appendJSONString(buf, m.CorrelationID)
	}
	if m.ContentType != "" {
		buf = append(buf, `,"content_type":`...)
		buf = appendJSONString(buf, m.ContentType)
	}
	if m.PartitionKey != "" {
		buf = append(buf, `,"partition_key":`...)
		buf = appendJSONString(buf, m.PartitionKey)
	}
	buf = append(buf, `,"headers":`...)
	switch {
	case len(m.Headers) == 0:
		buf = append(buf, "{}"...)
	case bytes.ContainsAny(m.Headers, "\r\n"):
		// Line breaks in valid JSON are whitespace (jsonb never writes
		// them, but a caller may): compacted, the line stays one line.
		var c bytes.Buffer
		if json.Compact(&c, m.Headers) == nil {
			buf = append(buf, c.Bytes()...)
		} else {
			buf = append(buf, "{}"...) // unreachable: Send checked the JSON
		}
	default:
		buf = append(buf, m.Headers...)
	}
	buf = append(buf, `,"payload":"`...)
	buf = base64.StdEncoding.AppendEncode(buf, m.Payload)
	buf = append(buf, "\"}\n"...)
	return buf
}

// appendJSONString appends s as a JSON string, as encoding/json writes it.
// A string of printable ASCII that needs no escape (a UUID, most topics) is
// quoted by hand: json.Marshal, which allocates, and strconv's quoting, which
// judges each rune, were a tenth of the binary's time in a drain.
func appendJSONString(buf []byte, s string) []byte {
	if plainJSON(s) {
		buf = append(buf, '"')
		buf = append(buf, s...)
		return append(buf, '"')
	}
	q, _ := json.Marshal(s) // a string always marshals
	return append(buf, q...)
}

// plainJSON says encoding/json writes s between quotes as it is: printable
// ASCII, and none of the characters it escapes (the quote, the backslash, and
// <, > and &, which it escapes for HTML).
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// MessagingSystem names the broker in the sweeper's spans (messaging.system).
func (p *Producer) MessagingSystem() string { return "stdout" }
