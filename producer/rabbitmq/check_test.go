package rabbitmq_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/rabbitmq"
	"github.com/outbox-sweeper/sweeper/test/tcpproxy"
)

func TestCheckPassesAgainstTheBrokerAndConnectsIfNeeded(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, f.p.Check(ctx))

	// A producer that has not connected yet connects for the check.
	p, err := rabbitmq.New(rabbitmq.Config{URL: f.url, Exchange: f.exchange})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	require.NoError(t, p.Check(ctx))
	require.NotNil(t, rabbitmq.Conn(p))
}

// The exchange is gone: the broker answers, but not "all is well".
func TestCheckFailsWhenTheExchangeIsGone(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Config{})
	ch, err := f.conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDelete(f.exchange, false, false))
	err = f.p.Check(context.Background())
	require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
	require.ErrorContains(t, err, "passive declare of exchange")
}

func TestCheckFailsWithinItsDeadlineWhenTheBrokerRefuses(t *testing.T) {
	t.Parallel()
	url := brokertest.RabbitMQURL(t)
	proxy := tcpproxy.New(t, brokertest.HostPort(t, url))
	proxy.Refuse(true)
	p, err := rabbitmq.New(rabbitmq.Config{URL: brokertest.WithHost(t, url, proxy.Addr())})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	err = checkWithin(t, p, 2*time.Second)
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
}

// A broker that accepts the TCP connection and never says a word: the check
// ends at its deadline, not at DialTimeout, even while another caller waits on
// the same dial without a deadline.
func TestCheckFailsWithinItsDeadlineWhenTheBrokerHangs(t *testing.T) {
	t.Parallel()
	url := brokertest.RabbitMQURL(t)
	proxy := tcpproxy.New(t, brokertest.HostPort(t, url))
	proxy.Hang(true)
	p, err := rabbitmq.New(rabbitmq.Config{URL: brokertest.WithHost(t, url, proxy.Addr()), DialTimeout: 30 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })

	err = checkWithin(t, p, 300*time.Millisecond)
	require.NotEqual(t, producer.ClassMessage, producer.ClassOf(err))

	connecting := make(chan struct{})
	go func() {
		defer close(connecting)
		_ = p.Connect(context.Background()) // holds the dial for DialTimeout
	}()
	time.Sleep(50 * time.Millisecond)
	err = checkWithin(t, p, 300*time.Millisecond)
	require.NotEqual(t, producer.ClassMessage, producer.ClassOf(err))
	proxy.Cut() // ends the hung dial
	<-connecting
}

// The connection is open and the broker then stops answering (a frozen
// process, a half-open network): the passive declare never returns, and the
// check ends at its deadline anyway. Once the broker answers again, so does
// the check.
func TestCheckFailsWithinItsDeadlineWhenAnOpenConnectionGoesSilent(t *testing.T) {
	t.Parallel()
	url := brokertest.RabbitMQURL(t)
	fr := newFreezer(t, brokertest.HostPort(t, url))
	p, err := rabbitmq.New(rabbitmq.Config{URL: brokertest.WithHost(t, url, fr.addr())})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	require.NoError(t, p.Connect(context.Background()))

	fr.frozen.Store(true)
	err = checkWithin(t, p, 500*time.Millisecond)
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
	require.Equal(t, "no_answer", producer.ReasonOf(err))

	fr.frozen.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, p.Check(ctx))
}

// checkWithin runs Check with a deadline of d and fails t unless it returns an
// error by then (with a little slack for a busy machine).
func checkWithin(t *testing.T, p *rabbitmq.Producer, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	err := p.Check(ctx)
	require.Error(t, err)
	require.Less(t, time.Since(start), d+time.Second, "Check outlived its deadline: %v", err)
	return err
}

// freezer forwards TCP connections to target and, while frozen, holds every
// byte in both directions: an open connection whose peer has gone silent.
type freezer struct {
	ln     net.Listener
	frozen atomic.Bool
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fr := &freezer{ln: ln}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Go(func() { fr.pipe(up, c) })
			wg.Go(func() { fr.pipe(c, up) })
		}
	})
	return fr
}

func (fr *freezer) addr() string { return fr.ln.Addr().String() }

// pipe copies src to dst, holding what it read while frozen.
func (fr *freezer) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for n > 0 && fr.frozen.Load() {
			time.Sleep(5 * time.Millisecond)
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF or closed: the deferred closes pass it on
			return
		}
	}
}
