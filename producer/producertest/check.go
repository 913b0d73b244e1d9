package producertest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/test/tcpproxy"
)

// Connector is a producer with a health check that can connect ahead of its
// first send, as the RabbitMQ and NATS producers are.
type Connector interface {
	producer.Checker
	Connect(ctx context.Context) error
	Close(ctx context.Context) error
}

// checkSlack is what CheckWithin allows past the check's deadline: room for a
// busy machine, and still well short of the producers' dial timeouts (30 s in
// their tests), which is what a check that ignored its deadline would take.
const checkSlack = 10 * time.Second

// CheckWithin runs c's Check with a deadline of d and fails t unless it
// returns an error by then (with checkSlack for a busy machine).
func CheckWithin(t *testing.T, c producer.Checker, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	err := c.Check(ctx)
	require.Error(t, err)
	require.Less(t, time.Since(start), d+checkSlack, "Check outlived its deadline: %v", err)
	return err
}

// CheckFailsWhenTheBrokerRefusesOrHangs is what every producer's health check
// must do against a broker that is down: through a proxy to target that
// refuses connections, Check fails within its deadline as the broker's
// failure; through one that accepts and never answers, Check ends at its
// deadline, not at the producer's dial timeout, even while a Connect without a
// deadline holds the dial. newProducer builds a producer for host:port with a
// dial timeout well beyond checkSlack (the tests use 30 s), which is what
// shows the last point.
func CheckFailsWhenTheBrokerRefusesOrHangs(t *testing.T, target string, newProducer func(t *testing.T, hostport string) Connector) {
	t.Run("refusing", func(t *testing.T) {
		t.Parallel()
		proxy := tcpproxy.New(t, target)
		proxy.Refuse(true)
		p := newProducer(t, proxy.Addr())
		t.Cleanup(func() { _ = p.Close(context.Background()) })
		err := CheckWithin(t, p, 2*time.Second)
		require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
	})
	t.Run("hanging", func(t *testing.T) {
		t.Parallel()
		proxy := tcpproxy.New(t, target)
		proxy.Hang(true)
		p := newProducer(t, proxy.Addr())
		t.Cleanup(func() { _ = p.Close(context.Background()) })
		err := CheckWithin(t, p, 300*time.Millisecond)
		require.NotEqual(t, producer.ClassMessage, producer.ClassOf(err))

		connecting := make(chan struct{})
		go func() {
			defer close(connecting)
			_ = p.Connect(context.Background()) // holds the dial for the producer's own timeout
		}()
		// Whether the check runs before or after the Connect takes the dial,
		// it must end at its own deadline.
		err = CheckWithin(t, p, 300*time.Millisecond)
		require.NotEqual(t, producer.ClassMessage, producer.ClassOf(err))
		// End the Connect's dial, whether it is hung already or not yet begun.
		proxy.Hang(false)
		proxy.Refuse(true)
		proxy.Cut()
		<-connecting
	})
}

// RequireEachRowOnce checks what a producer's Batches returned for rows of
// topic, as every producer's fuzz test does: a topic-class refusal cuts
// nothing (and reports true); otherwise every row stands once, either in a
// batch of topic or named in a message-class error with a dead-letter reason.
func RequireEachRowOnce(t testing.TB, topic string, rows []producer.Message, batches []producer.Batch, err error) (topicRefused bool) {
	t.Helper()
	if err != nil && producer.ClassOf(err) == producer.ClassTopic {
		require.Nil(t, batches)
		require.Equal(t, "invalid_topic", producer.ReasonOf(err))
		return true
	}
	var seen []int64
	for _, b := range batches {
		require.Equal(t, topic, b.Topic)
		require.NotEmpty(t, b.Messages)
		seen = append(seen, b.IDs()...)
	}
	if err != nil {
		require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "%v", err)
		for _, id := range producer.MessageIDs(err) {
			require.Contains(t, []string{producer.ReasonInvalidMessage, producer.ReasonMessageTooLarge}, producer.RowReason(err, id))
		}
		seen = append(seen, producer.MessageIDs(err)...)
	}
	slices.Sort(seen)
	require.Equal(t, producer.Batch{Messages: rows}.IDs(), seen, "each row once, in a batch or in the error")
	return false
}

// RequireBatchesAndSendAgree runs p's Batches on rows of topic and checks it
// as RequireEachRowOnce does, then sends each batch with a cancelled context:
// Send checks its rows before it reaches the broker, and must refuse none of
// the rows Batches kept. Every producer's fuzz test runs it.
func RequireBatchesAndSendAgree(t testing.TB, p producer.Producer, topic string, rows []producer.Message) {
	t.Helper()
	batches, err := p.Batches(context.Background(), topic, rows)
	if RequireEachRowOnce(t, topic, rows, batches, err) {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, b := range batches {
		err := p.Send(ctx, b)
		require.Error(t, err)
		require.NotEqual(t, producer.ClassMessage, producer.ClassOf(err), "Send refused a row Batches kept: %v", err)
	}
}
