package rabbitmq_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
	"github.com/outbox-sweeper/sweeper/producer/rabbitmq"
)

func TestCheckPassesAgainstTheBrokerAndConnectsIfNeeded(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
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

// A broker that refuses, or accepts and never answers: the check fails within
// its own deadline, not at DialTimeout.
func TestCheckFailsWhenTheBrokerRefusesOrHangs(t *testing.T) {
	t.Parallel()
	url := brokertest.RabbitMQURL(t)
	producertest.CheckFailsWhenTheBrokerRefusesOrHangs(t, brokertest.HostPort(t, url), func(t *testing.T, hostport string) producertest.Connector {
		p, err := rabbitmq.New(rabbitmq.Config{URL: brokertest.WithHost(t, url, hostport), DialTimeout: 30 * time.Second})
		require.NoError(t, err)
		return p
	})
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

	fr.set(true)
	err = producertest.CheckWithin(t, p, 500*time.Millisecond)
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
	require.Equal(t, "no_answer", producer.ReasonOf(err))

	fr.set(false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, p.Check(ctx))
}

// freezer forwards TCP connections to target and, while frozen, holds every
// byte in both directions: an open connection whose peer has gone silent.
type freezer struct {
	ln     net.Listener
	mu     sync.Mutex
	thawed *sync.Cond // signalled when frozen turns false
	frozen bool
}

// set freezes (true) or thaws the connections.
func (fr *freezer) set(frozen bool) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	fr.frozen = frozen
	fr.thawed.Broadcast()
}

// waitThawed blocks while the connections are frozen.
func (fr *freezer) waitThawed() {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	for fr.frozen {
		fr.thawed.Wait()
	}
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fr := &freezer{ln: ln}
	fr.thawed = sync.NewCond(&fr.mu)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		fr.set(false) // a pipe holding bytes must see the close
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
		if n > 0 {
			fr.waitThawed()
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

// A send that must open a channel on a connection gone silent (a broker whose
// alarm blocks it) ends by its deadline as the broker's failure, not when
// heartbeats give up.
func TestASendOpeningAChannelOnASilentConnectionEndsByItsDeadline(t *testing.T) {
	t.Parallel()
	url := brokertest.RabbitMQURL(t)
	fr := newFreezer(t, brokertest.HostPort(t, url))
	exchange := brokertest.Name("outbox_test")
	p, err := rabbitmq.New(rabbitmq.Config{URL: brokertest.WithHost(t, url, fr.addr()), Exchange: exchange})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	require.NoError(t, p.Connect(context.Background()))
	rabbitmq.DropIdle(p)

	fr.set(true)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = p.Send(ctx, producer.Batch{Topic: "t", Messages: producertest.Messages("t", 1, 1)})
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
	require.Equal(t, "no_answer", producer.ReasonOf(err))
	require.ErrorContains(t, err, "open a RabbitMQ channel")
	fr.set(false)
}

// An exchange that exists with another type refuses the declare every new
// channel makes: the broker's failure, for every topic, not a transient one
// the rows would be charged for.
func TestAnExchangeOfAnotherTypeIsTheBrokersFailure(t *testing.T) {
	t.Parallel()
	url := brokertest.RabbitMQURL(t)
	exchange := brokertest.Name("outbox_test")
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(exchange, "direct", true, false, false, false, nil))
	t.Cleanup(func() { _ = ch.ExchangeDelete(exchange, false, false) })

	p, err := rabbitmq.New(rabbitmq.Config{URL: url, Exchange: exchange})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = p.Send(ctx, producer.Batch{Topic: "t", Messages: producertest.Messages("t", 1, 1)})
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
	require.Equal(t, "exchange_refused", producer.ReasonOf(err))
	require.ErrorContains(t, err, "inequivalent arg")
}
