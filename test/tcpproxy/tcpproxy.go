// Package tcpproxy is a TCP proxy a test controls, to make a database or broker
// go away and come back: refuse new connections, cut the open ones, stall
// them, heal.
package tcpproxy

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards connections from a loopback port to a target address.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	refuse  bool
	hang    bool
	accepts int
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
	stopped bool
	// stalled is non-nil while the proxy stalls, and closed when it stops;
	// reached receives when a client's bytes arrive meanwhile.
	stalled chan struct{}
	reached chan struct{}
}

// New starts a proxy to target on 127.0.0.1 and stops it at t's cleanup.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{target: target, ln: ln, conns: make(map[net.Conn]struct{}), reached: make(chan struct{}, 1)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Refuse makes the proxy close new connections at once (true), or forward them
// again (false). It does not touch open connections: see Cut.
func (p *Proxy) Refuse(refuse bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = refuse
}

// Hang makes the proxy accept new connections and then forward nothing (true),
// as a server that is overloaded or half-dead would, or forward them again
// (false). Hung connections are closed by Cut and Close.
func (p *Proxy) Hang(hang bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hang = hang
}

// Stall makes the proxy hold what either side sends on its open connections
// (true), as a broker that takes requests and never answers would, or forward
// it again (false). Unlike Hang, it reaches the connections already open.
func (p *Proxy) Stall(stall bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case stall && p.stalled == nil:
		p.stalled = make(chan struct{})
	case !stall && p.stalled != nil:
		close(p.stalled)
		p.stalled = nil
	}
}

// Reached receives when a client's bytes arrive while the proxy stalls: a
// request reached the stalled broker.
func (p *Proxy) Reached() <-chan struct{} { return p.reached }

// Accepts returns how many connections the proxy has accepted so far, refused,
// hung or forwarded: a client retrying in a busy loop shows here.
func (p *Proxy) Accepts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepts
}

// Cut closes every open connection, as a restarted server or a broken network
// would.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// Close stops the proxy and cuts its connections.
func (p *Proxy) Close() {
	p.Stall(false)
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		p.accepts++
		refuse, hang := p.refuse || p.stopped, p.hang
		p.mu.Unlock()
		if refuse {
			_ = c.Close()
			continue
		}
		if hang {
			p.track(c) // held open, silent, until Cut or Close
			continue
		}
		upstream, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, upstream) {
			continue
		}
		p.wg.Add(2)
		go p.pipe(c, upstream, false)
		go p.pipe(upstream, c, true)
	}
}

func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies until either side fails, then closes both, so a cut on one side
// reaches the other. While the proxy stalls it holds what it read; fromClient
// says src is the client's side.
func (p *Proxy) pipe(dst, src net.Conn, fromClient bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			stalled := p.stalled
			p.mu.Unlock()
			if stalled != nil {
				if fromClient {
					select {
					case p.reached <- struct{}{}:
					default:
					}
				}
				<-stalled
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}
