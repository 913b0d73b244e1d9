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
	"github.com/outbox-sweeper/sweeper/producer/producertest"
	"github.com/outbox-sweeper/sweeper/test/tcpproxy"
)

func TestCheckPassesAgainstTheServerAndConnectsIfNeeded(t *testing.T) {
	t.Parallel()
	f := setup(t, outboxnats.Config{}, jetstream.StreamConfig{})
	require.NoError(t, f.p.Check(context.Background()), "a ctx without a deadline gets one")

	p, err := outboxnats.New(outboxnats.Config{URL: brokertest.NATSURL(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, p.Check(ctx))
	require.NotNil(t, outboxnats.Conn(p))
}

// A server that refuses, or accepts and never answers: the check fails within
// its own deadline, not at ConnectTimeout.
func TestCheckFailsWhenTheServerRefusesOrHangs(t *testing.T) {
	t.Parallel()
	url := brokertest.NATSURL(t)
	producertest.CheckFailsWhenTheBrokerRefusesOrHangs(t, brokertest.HostPort(t, url), func(t *testing.T, hostport string) producertest.Connector {
		p, err := outboxnats.New(outboxnats.Config{URL: brokertest.WithHost(t, url, hostport), ConnectTimeout: 30 * time.Second})
		require.NoError(t, err)
		return p
	})
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
	require.Eventually(t, func() bool { return !outboxnats.Conn(p).IsConnected() }, time.Minute, 5*time.Millisecond)
	err = producertest.CheckWithin(t, p, 2*time.Second)
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)

	proxy.Refuse(false)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return p.Check(ctx) == nil
	}, 2*time.Minute, 50*time.Millisecond)
}
