// Package producertest helps test producers: messages shaped as the sweeper
// hands them over.
package producertest

import (
	"fmt"

	"github.com/outbox-sweeper/sweeper/producer"
)

// Messages returns n messages of topic with row ids from, from+1, …, each with a
// message id derived from its row id, the body "body-<id>" and no headers.
func Messages(topic string, from, n int) []producer.Message {
	out := make([]producer.Message, n)
	for i := range out {
		id := int64(from + i)
		out[i] = producer.Message{
			ID: id, MessageID: fmt.Sprintf("00000000-0000-4000-8000-%012d", id), Topic: topic,
			Payload: fmt.Appendf(nil, "body-%d", id), Headers: []byte(`{}`),
		}
	}
	return out
}
