package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
	"github.com/outbox-sweeper/sweeper/producer/rabbitmq"
	"github.com/outbox-sweeper/sweeper/test/tcpproxy"
)

// fixture is a producer on an exchange of the test's own, and a connection to
// consume with.
type fixture struct {
	url      string
	exchange string
	p        *rabbitmq.Producer
	conn     *amqp.Connection
}

func setup(t testing.TB, cfg rabbitmq.Config) *fixture {
	t.Helper()
	f := &fixture{url: brokertest.RabbitMQURL(t), exchange: brokertest.Name("outbox_test")}
	if cfg.URL == "" {
		cfg.URL = f.url
	}
	cfg.Exchange = f.exchange
	p, err := rabbitmq.New(cfg)
	require.NoError(t, err)
	require.NoError(t, p.Connect(context.Background()))
	f.p = p
	conn, err := amqp.Dial(f.url)
	require.NoError(t, err)
	f.conn = conn
	t.Cleanup(func() {
		_ = p.Close(context.Background())
		if ch, err := conn.Channel(); err == nil {
			_ = ch.ExchangeDelete(f.exchange, false, false)
		}
		_ = conn.Close()
	})
	return f
}

// bindOnly declares a queue with args bound to routing key topic, and
// returns the channel and the queue's name; the queue goes with the
// fixture's connection (exclusive).
func (f *fixture) bindOnly(t testing.TB, topic string, args amqp.Table) (*amqp.Channel, string) {
	t.Helper()
	ch, err := f.conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclare("", false, true, true, false, args)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, topic, f.exchange, false, nil))
	return ch, q.Name
}

// bind declares a queue bound to routing key topic and returns a function that
// waits for n deliveries and returns them.
func (f *fixture) bind(t *testing.T, topic string, args amqp.Table) func(n int) []amqp.Delivery {
	t.Helper()
	ch, q := f.bindOnly(t, topic, args)
	deliveries, err := ch.Consume(q, "", true, true, false, false, nil)
	require.NoError(t, err)
	return func(n int) []amqp.Delivery {
		t.Helper()
		var got []amqp.Delivery
		timeout := time.After(time.Minute)
		for len(got) < n {
			select {
			case d := <-deliveries:
				got = append(got, d)
			case <-timeout:
				t.Fatalf("got %d of %d messages on %q", len(got), n, topic)
			}
		}
		return got
	}
}

func TestSendMapsEveryField(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Config{})
	recv := f.bind(t, "orders.paid", nil)
	created := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	m := producer.Message{
		ID: 1, MessageID: "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22", Topic: "orders.paid",
		Payload: []byte{0, 1, 0xff}, Headers: []byte(`{"tenant":"acme","n":2,"f":1.5,"nested":{"a":[1,"x"]},"ok":true,"big":1234567890123456789}`),
		ContentType: "application/octet-stream", CorrelationID: "req-1", PartitionKey: "order-42", CreatedAt: created,
	}
	require.NoError(t, f.p.Send(context.Background(), producer.Batch{Topic: "orders.paid", Messages: []producer.Message{m}}))
	d := recv(1)[0]
	require.Equal(t, m.Payload, d.Body)
	require.Equal(t, m.MessageID, d.MessageId)
	require.Equal(t, "req-1", d.CorrelationId)
	require.Equal(t, "application/octet-stream", d.ContentType)
	require.Equal(t, uint8(amqp.Persistent), d.DeliveryMode)
	require.True(t, created.Equal(d.Timestamp))
	require.Equal(t, "orders.paid", d.RoutingKey)
	require.Equal(t, "acme", d.Headers["tenant"])
	require.Equal(t, int64(2), d.Headers["n"])
	require.Equal(t, int64(1234567890123456789), d.Headers["big"], "64-bit ids keep every digit")
	require.Equal(t, 1.5, d.Headers["f"])
	require.Equal(t, true, d.Headers["ok"])
	require.Equal(t, "order-42", d.Headers["partition_key"])
	require.Equal(t, amqp.Table{"a": []any{int64(1), "x"}}, d.Headers["nested"])
}

// A row's deadline travels as the message's expiration, the time left
// (RabbitMQ drops a message from its queues once that passes); a row
// without one has none.
func TestTheRowsDeadlineTravelsAsTheExpiration(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Config{})
	recv := f.bind(t, "ttl", nil)
	ms := producertest.Messages("ttl", 1, 2)
	ms[0].ExpiresAt = time.Now().Add(time.Hour)
	require.NoError(t, f.p.Send(context.Background(), producer.Batch{Topic: "ttl", Messages: ms}))
	got := recv(2)
	left, err := strconv.ParseInt(got[0].Expiration, 10, 64)
	require.NoError(t, err, "expiration %q", got[0].Expiration)
	require.InDelta(t, time.Hour.Milliseconds(), left, float64(time.Minute.Milliseconds()), "the time left, in milliseconds")
	require.Empty(t, got[1].Expiration, "no deadline, no expiration")

}

func TestBatchArrivesWholeAndInOrder(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Config{})
	recv := f.bind(t, "t", nil)
	batch := producer.Batch{Topic: "t", Messages: producertest.Messages("t", 1, 300)}
	require.NoError(t, f.p.Send(context.Background(), batch))
	got := recv(300)
	for i, d := range got {
		require.Equal(t, fmt.Sprintf("body-%d", i+1), string(d.Body))
	}
}

func TestUnroutableTopicIsTopicClass(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Config{})
	err := f.p.Send(context.Background(), producer.Batch{Topic: "nobody.listens", Messages: producertest.Messages("nobody.listens", 1, 3)})
	require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
	require.Equal(t, "unroutable", producer.ReasonOf(err))
	require.ErrorContains(t, err, `3 of 3 messages returned by exchange "`+f.exchange+`" for routing key "nobody.listens"`)
	require.ErrorContains(t, err, "NO_ROUTE")

	// The channel stays usable: the next batch to a bound topic goes through.
	recv := f.bind(t, "bound", nil)
	require.NoError(t, f.p.Send(context.Background(), producer.Batch{Topic: "bound", Messages: producertest.Messages("bound", 10, 2)}))
	require.Len(t, recv(2), 2)
}

// A queue that rejects publishes past its length makes RabbitMQ nack them:
// topic class, so that the rows wait for the queue rather than count
// attempts and go to the dead-letter table while its consumer is down.
func TestNackIsTopicClass(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Config{})
	// No consumer, so the queue stays full.
	ch, err := f.conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "full", f.exchange, false, nil))
	err = f.p.Send(context.Background(), producer.Batch{Topic: "full", Messages: producertest.Messages("full", 1, 3)})
	require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
	require.Equal(t, "nacked", producer.ReasonOf(err))
	require.ErrorContains(t, err, "nacked 2 of 3 messages")
	require.ErrorContains(t, err, "x-overflow reject-publish")
	require.Equal(t, []int64{1}, producer.Delivered(err), "the message the queue took is named delivered; the sweeper sends only the nacked again")
}

func TestInvalidHeadersAreMessageClass(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Config{})
	batch := producer.Batch{Topic: "t", Messages: producertest.Messages("t", 1, 3)}
	batch.Messages[1].Headers = []byte(`["not","an","object"]`)
	err := f.p.Send(context.Background(), batch)
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err))
	require.Equal(t, []int64{2}, producer.MessageIDs(err))
}

func TestBatchesCutByCountAndBytesAndRejectTooLarge(t *testing.T) {
	t.Parallel()
	p, err := rabbitmq.New(rabbitmq.Config{URL: "amqp://127.0.0.1:1/", MaxBatch: 3, MaxBatchBytes: 25, MaxMessageBytes: 20})
	require.NoError(t, err)
	in := producertest.Messages("t", 1, 7) // payloads "body-N": 6 bytes each
	in[4].Payload = make([]byte, 21)
	in[5].Payload = make([]byte, 20)
	batches, err := p.Batches(context.Background(), "t", in)
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err))
	require.Equal(t, []int64{5}, producer.MessageIDs(err))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.RowReason(err, 5))
	require.ErrorContains(t, err, "row 5: payload of 21 bytes is over RabbitMQ's limit of 20")
	var cut [][]int64
	for _, b := range batches {
		cut = append(cut, b.IDs())
	}
	// 3 by count; then 4 (6 bytes) + 6 (20 bytes) would be 26 > 25; then 6 and 7.
	require.Equal(t, [][]int64{{1, 2, 3}, {4}, {6}, {7}}, cut)
}

// The connection drops under the producer: the send in flight fails as a
// broker failure (or went through), and the next send opens a new connection
// by itself.
func TestConnectionCutIsReestablished(t *testing.T) {
	t.Parallel()
	url := brokertest.RabbitMQURL(t)
	proxy := tcpproxy.New(t, brokertest.HostPort(t, url))
	f := setup(t, rabbitmq.Config{URL: brokertest.WithHost(t, url, proxy.Addr())})
	recv := f.bind(t, "t", nil)

	require.NoError(t, f.p.Send(context.Background(), producer.Batch{Topic: "t", Messages: producertest.Messages("t", 1, 5)}))
	proxy.Cut()
	// The first sends may not notice the cut yet; the deadline decides when
	// to give up, the sleep only paces the tries.
	deadline := time.Now().Add(time.Minute)
	for i := 0; ; i++ {
		err := f.p.Send(context.Background(), producer.Batch{Topic: "t", Messages: producertest.Messages("t", 100+i*5, 5)})
		if err == nil {
			break
		}
		require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
		require.True(t, time.Now().Before(deadline), "no send went through after the cut: %v", err)
		time.Sleep(20 * time.Millisecond)
	}
	got := recv(10)
	require.Equal(t, "body-1", string(got[0].Body), "the batch before the cut arrived")
}

// The connection drops after a batch is published and before its confirms come
// back: Send must return, as a broker failure (the rows are not to blame), not
// wait forever (amqp091 closes the channel's notification channels on
// shutdown). The connection goes through a freezer, frozen once the producer
// holds its channel: the publishes leave the producer but no confirm can come
// back before the socket is closed under it, however slow the machine.
func TestConnectionLostWhileConfirmsArePending(t *testing.T) {
	t.Parallel()
	url := brokertest.RabbitMQURL(t)
	for i := range 10 {
		fr := newFreezer(t, brokertest.HostPort(t, url))
		f := setup(t, rabbitmq.Config{URL: brokertest.WithHost(t, url, fr.addr())}) // connects, and keeps the channel
		f.bind(t, "t", nil)
		fr.set(true)
		rabbitmq.SetAfterPublish(f.p, func() { rabbitmq.CloseSocket(f.p) })
		done := make(chan error, 1)
		go func() {
			done <- f.p.Send(context.Background(), producer.Batch{Topic: "t", Messages: producertest.Messages("t", i*100+1, 50)})
		}()
		select {
		case err := <-done:
			require.Error(t, err, "send %d: confirmed though no confirm could come", i)
			require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
		case <-time.After(time.Minute):
			t.Fatal("Send hung after the connection dropped with confirms pending")
		}
	}
}

func TestBrokerDownIsBrokerClassAndClosedIsLocal(t *testing.T) {
	t.Parallel()
	proxy := tcpproxy.New(t, brokertest.HostPort(t, brokertest.RabbitMQURL(t)))
	proxy.Refuse(true)
	p, err := rabbitmq.New(rabbitmq.Config{URL: brokertest.WithHost(t, brokertest.RabbitMQURL(t), proxy.Addr()), DialTimeout: time.Second})
	require.NoError(t, err)
	err = p.Send(context.Background(), producer.Batch{Topic: "t", Messages: producertest.Messages("t", 1, 1)})
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
	require.Equal(t, "connection_lost", producer.ReasonOf(err))
	require.ErrorContains(t, err, "connect to RabbitMQ")

	require.NoError(t, p.Close(context.Background()))
	err = p.Send(context.Background(), producer.Batch{Topic: "t", Messages: producertest.Messages("t", 1, 1)})
	require.Equal(t, producer.ClassLocal, producer.ClassOf(err))
}

// Concurrent sends on different topics each get a channel of their own.
func TestConcurrentSends(t *testing.T) {
	t.Parallel()
	f := setup(t, rabbitmq.Config{})
	var recvs []func(int) []amqp.Delivery
	for i := range 4 {
		recvs = append(recvs, f.bind(t, fmt.Sprint("c", i), nil))
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range 4 {
		wg.Go(func() {
			for j := range 10 {
				if err := f.p.Send(context.Background(), producer.Batch{Topic: fmt.Sprint("c", i), Messages: producertest.Messages(fmt.Sprint("c", i), j*10+1, 10)}); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	for _, r := range recvs {
		require.Len(t, r(100), 100)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	_, err := rabbitmq.New(rabbitmq.Config{})
	require.ErrorContains(t, err, "no URL (--rabbitmq-url)")
	_, err = rabbitmq.New(rabbitmq.Config{URL: "http://x"})
	require.ErrorContains(t, err, "invalid URL (--rabbitmq-url)")
	_, err = rabbitmq.New(rabbitmq.Config{URL: "amqp://127.0.0.1/", Exchange: strings.Repeat("x", 256)})
	require.ErrorContains(t, err, "exchange name of 256 bytes is over AMQP's short-string limit of 255 bytes (--rabbitmq-exchange)")
	require.True(t, strings.HasPrefix(rabbitmq.ExchangeDefault, "outbox"))
}
