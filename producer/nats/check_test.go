package nats_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/producer"
	outboxnats "github.com/outbox-sweeper/sweeper/producer/nats"
	"github.com/outbox-sweeper/sweeper/test/tcpproxy"
)

func TestCheckPassesAgainstTheServerAndConnectsIfNeeded(t *testing.T) {
	t.Parallel()
	f := setup(t, outboxnats.Config{}, jetstream.StreamConfig{})
	require.NoError(t, f.p.Check(context.Background()), "a ctx without a deadline gets one")

	p, err := outboxnats.New(outboxnats.Config{URL: brokertest.NATSURL(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, p.Check(ctx))
	require.NotNil(t, outboxnats.Conn(p))
}

func TestCheckFailsWithinItsDeadlineWhenTheServerRefuses(t *testing.T) {
	t.Parallel()
	url := brokertest.NATSURL(t)
	proxy := tcpproxy.New(t, brokertest.HostPort(t, url))
	proxy.Refuse(true)
	p, err := outboxnats.New(outboxnats.Config{URL: brokertest.WithHost(t, url, proxy.Addr())})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	err = checkWithin(t, p, 2*time.Second)
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
}

// A server that accepts and never answers: the check ends at its deadline,
// not at ConnectTimeout, even while a Connect without a deadline holds the
// dial.
func TestCheckFailsWithinItsDeadlineWhenTheServerHangs(t *testing.T) {
	t.Parallel()
	url := brokertest.NATSURL(t)
	proxy := tcpproxy.New(t, brokertest.HostPort(t, url))
	proxy.Hang(true)
	p, err := outboxnats.New(outboxnats.Config{URL: brokertest.WithHost(t, url, proxy.Addr()), ConnectTimeout: 30 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })

	err = checkWithin(t, p, 300*time.Millisecond)
	require.NotEqual(t, producer.ClassMessage, producer.ClassOf(err))

	connecting := make(chan struct{})
	go func() {
		defer close(connecting)
		_ = p.Connect(context.Background())
	}()
	time.Sleep(50 * time.Millisecond)
	err = checkWithin(t, p, 300*time.Millisecond)
	require.NotEqual(t, producer.ClassMessage, producer.ClassOf(err))
	proxy.Cut()
	<-connecting
}

// The connection drops and the client is reconnecting: the check says so at
// once, as the broker's failure, and passes again once the server is back.
func TestCheckFailsWhileReconnectingAndPassesOnceBack(t *testing.T) {
	t.Parallel()
	url := brokertest.NATSURL(t)
	proxy := tcpproxy.New(t, brokertest.HostPort(t, url))
	p, err := outboxnats.New(outboxnats.Config{URL: brokertest.WithHost(t, url, proxy.Addr())})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	require.NoError(t, p.Connect(context.Background()))

	proxy.Refuse(true)
	proxy.Cut()
	require.Eventually(t, func() bool { return !outboxnats.Conn(p).IsConnected() }, 10*time.Second, 5*time.Millisecond)
	err = checkWithin(t, p, 2*time.Second)
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)

	proxy.Refuse(false)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return p.Check(ctx) == nil
	}, 20*time.Second, 50*time.Millisecond)
}

// checkWithin runs Check with a deadline of d and fails t unless it returns an
// error by then (with a little slack for a busy machine).
func checkWithin(t *testing.T, p *outboxnats.Producer, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	err := p.Check(ctx)
	require.Error(t, err)
	require.Less(t, time.Since(start), d+time.Second, "Check outlived its deadline: %v", err)
	return err
}
