package rabbitmq

// SetAfterPublish lets tests break the connection between a batch's publishes
// and its confirms.
func SetAfterPublish(p *Producer, f func()) { p.afterPublish = f }

// CloseSocket closes the producer's socket under the AMQP client, as a network
// failure would.
func CloseSocket(p *Producer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.cork.Conn.Close()
}
