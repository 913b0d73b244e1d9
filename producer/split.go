package producer

// Limits bound the batches [Split] cuts. A zero field means no limit.
type Limits struct {
	// Messages is the most messages in one batch.
	Messages int
	// Bytes is the most bytes, as Size counts them, in one batch.
	Bytes int
	// MessageBytes is the most bytes one message may have; larger ones can
	// never be sent.
	MessageBytes int
	// Size tells a message's size; nil counts the payload alone.
	Size func(*Message) int
}

// Split cuts msgs, all of topic, into batches within l, keeping their order.
// Messages over l.MessageBytes are left out of every batch and returned in
// tooBig, with the largest size among them, for the producer's message-class
// error: the broker would reject them, and their neighbours must go on.
func Split(topic string, msgs []Message, l Limits) (batches []Batch, tooBig []int64, largest int) {
	size := l.Size
	if size == nil {
		size = func(m *Message) int { return len(m.Payload) }
	}
	cur, curBytes := Batch{Topic: topic}, 0
	for i := range msgs {
		m := &msgs[i]
		n := size(m)
		if l.MessageBytes > 0 && n > l.MessageBytes {
			tooBig = append(tooBig, m.ID)
			largest = max(largest, n)
			continue
		}
		full := (l.Messages > 0 && len(cur.Messages) == l.Messages) || (l.Bytes > 0 && curBytes+n > l.Bytes)
		if len(cur.Messages) > 0 && full {
			batches = append(batches, cur)
			cur, curBytes = Batch{Topic: topic}, 0
		}
		cur.Messages = append(cur.Messages, *m)
		curBytes += n
	}
	if len(cur.Messages) > 0 {
		batches = append(batches, cur)
	}
	return batches, tooBig, largest
}
