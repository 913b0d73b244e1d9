package rabbitmq

import (
	"bufio"
	"net"
	"sync"
	"time"
)

// corkConn is the AMQP connection's socket. While one or more batches are being
// published (corked), writes collect in a buffer instead of going out one small
// message at a time; the last uncork flushes them. Writes outside a batch
// (heartbeats, channel opens) go straight through, after whatever is buffered,
// so the byte stream keeps its order. A write never blocks on another goroutine,
// so corking cannot deadlock the client's own locks: at worst a control frame
// waits until the batch's last message is written.
type corkConn struct {
	net.Conn

	mu    sync.Mutex
	buf   *bufio.Writer
	corks int
}

func newCorkConn(c net.Conn) *corkConn {
	return &corkConn{Conn: c, buf: bufio.NewWriterSize(c, 64<<10)}
}

func (c *corkConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.corks > 0 {
		return c.buf.Write(b)
	}
	if c.buf.Buffered() > 0 {
		if err := c.buf.Flush(); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(b)
}

// cork starts a batch. A deadline (the send's) bounds the socket's writes until
// the last uncork, so a broker that stops reading (a memory or disk alarm blocks
// publishers) fails the send instead of hanging it.
func (c *corkConn) cork(deadline time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corks++
	if !deadline.IsZero() {
		_ = c.Conn.SetWriteDeadline(deadline)
	}
}

// uncork ends one batch's cork and sends what is buffered, so that the batch's
// messages reach the broker before its confirms are awaited. Other batches still
// corked keep collecting their writes.
func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corks--
	err := c.buf.Flush()
	if c.corks == 0 {
		_ = c.Conn.SetWriteDeadline(time.Time{})
	}
	return err
}
