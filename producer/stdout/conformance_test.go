package stdout_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/syncbuf"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
	"github.com/outbox-sweeper/sweeper/producer/stdout"
)

// The conformance suite against the stdout producer: a consumer parses its
// lines.
func TestConformance(t *testing.T) {
	t.Parallel()
	var (
		out    syncbuf.Buffer
		mu     sync.Mutex
		topics int
	)
	producertest.Run(t, producertest.Harness{
		New: func(*testing.T) producer.Producer { return stdout.New(&out, stdout.Config{}) },
		Topic: func(*testing.T) string {
			mu.Lock()
			defer mu.Unlock()
			topics++
			return "conformance." + string(rune('a'+topics))
		},
		Receive: func(t *testing.T, topic string, n int) []producertest.Received {
			lines := out.Bytes()
			var got []producertest.Received
			sc := bufio.NewScanner(bytes.NewReader(lines))
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				var l struct {
					MessageID     string          `json:"message_id"`
					Topic         string          `json:"topic"`
					CorrelationID *string         `json:"correlation_id"`
					ContentType   string          `json:"content_type"`
					PartitionKey  string          `json:"partition_key"`
					Headers       json.RawMessage `json:"headers"`
					Payload       string          `json:"payload"`
				}
				require.NoError(t, json.Unmarshal(sc.Bytes(), &l), "line %q", sc.Text())
				if l.Topic != topic {
					continue
				}
				payload, err := base64.StdEncoding.DecodeString(l.Payload)
				require.NoError(t, err)
				r := producertest.Received{MessageID: l.MessageID, ContentType: l.ContentType, PartitionKey: l.PartitionKey,
					Payload: payload, Headers: producertest.HeaderText(t, l.Headers)}
				if l.CorrelationID != nil {
					r.CorrelationID = *l.CorrelationID
				}
				got = append(got, r)
			}
			require.GreaterOrEqual(t, len(got), n, "lines of %s", topic)
			return got
		},
		// Headers that are not JSON: no consumer could parse the line.
		Poison: func(_ *testing.T, _ producer.Producer, m *producer.Message) { m.Headers = []byte(`{"unterminated`) },
		Skip: map[string]string{
			producertest.CaseUnknownDestination: "writes to a stream: every topic is a field of the line",
			producertest.CaseBrokerDown:         "writes to a stream: there is no broker, and its check always passes (a closed pipe fails the write as broker class)",
			producertest.CaseCloseDuringSend:    "a write blocked on a reader that stopped reading cannot be interrupted, and the stream is the caller's to close; --send-timeout's keep-alive rule frees such a send's rows",
		},
	})
}
