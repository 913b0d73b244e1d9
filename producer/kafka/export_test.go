package kafka

// SetLimit makes p take n as topic's max.message.bytes, as if read from the
// cluster.
func SetLimit(p *Producer, topic string, n int) {
	p.limitsMu.Lock()
	defer p.limitsMu.Unlock()
	p.limits[topic] = n
}
