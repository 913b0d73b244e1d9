package producertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/test/tcpproxy"
)

// The cases of [Run]. A harness names those its producer cannot pass in
// Skip, with the reason; the suite reports each as skipped with its reason
// (and fails on a reason left empty).
const (
	// CaseRoundTrip: a message's id, correlation id, content type,
	// partition key, headers and payload bytes arrive as they were.
	CaseRoundTrip = "round-trip"
	// CaseOrder: 300 messages of one topic (and one partition key), cut and
	// sent batch after batch, arrive in order.
	CaseOrder = "order"
	// CaseTooLarge: a message the broker can never take is message class and
	// names its row alone; its neighbours are sent.
	CaseTooLarge = "too-large"
	// CaseUnknownDestination: a destination the broker does not have is topic
	// class.
	CaseUnknownDestination = "unknown-destination"
	// CaseBrokerDown: a broker that cannot be reached is broker class, which
	// charges the rows no attempt.
	CaseBrokerDown = "broker-down"
	// CaseCloseDuringSend: Close ends a send the broker never answers, with an
	// error that blames no row.
	CaseCloseDuringSend = "close-during-send"
	// CaseAllOrNothing: a batch of which one message is refused delivers none
	// of its messages.
	CaseAllOrNothing = "all-or-nothing"
	// CaseRefusedMidBatch: a batch whose middle message is refused names
	// that row, and says which of the others the broker took
	// (producer.Delivered); sending the rest again, as the sweeper does,
	// delivers every other message exactly once, in order.
	CaseRefusedMidBatch = "refused-mid-batch"
	// CaseSendWritesNothing: Send writes nothing into the messages of the
	// batch it is given (their Prepared among them, which is Batches's to
	// set), nor into what Batches built: they are its caller's, who may read
	// them while it sends, or send them again while the broker's client
	// still holds the first send (two sends at once race under -race).
	CaseSendWritesNothing = "send-writes-nothing"
)

// Cases lists every case, in the order Run runs them.
var Cases = []string{CaseRoundTrip, CaseOrder, CaseTooLarge, CaseUnknownDestination, CaseBrokerDown, CaseCloseDuringSend, CaseAllOrNothing, CaseRefusedMidBatch,
	CaseSendWritesNothing}

// Received is a message as a consumer of the broker got it, mapped back to
// the outbox's fields by the harness.
type Received struct {
	MessageID, CorrelationID, ContentType, PartitionKey string
	// Headers holds the row's own headers (not those the producer adds from
	// columns), each as text: strings as they are, other JSON values as their
	// JSON text.
	Headers map[string]string
	Payload []byte
}

// Harness is what [Run] needs of a producer and its broker.
type Harness struct {
	// New returns a producer of the broker; the suite closes it.
	New func(t *testing.T) producer.Producer
	// Topic returns a destination of the case's own that exists, whose
	// messages Receive reads.
	Topic func(t *testing.T) string
	// Receive returns the messages that arrived on topic, in arrival order,
	// once at least n have; it fails t if they do not within a minute.
	Receive func(t *testing.T, topic string, n int) []Received
	// Poison makes m a message the broker refuses alone, whatever its
	// neighbours (too large, typically). CaseTooLarge and CaseAllOrNothing
	// need it.
	Poison func(t *testing.T, p producer.Producer, m *producer.Message)
	// Unknown returns a destination the broker does not have.
	Unknown func(t *testing.T) string
	// Down returns a producer whose broker cannot be reached.
	Down func(t *testing.T) producer.Producer
	// Stuck returns a producer whose broker takes its sends and never
	// answers, and a channel that receives once a send has reached it. A
	// first send to topic, before the broker stops answering, is allowed.
	Stuck func(t *testing.T, topic string) (producer.Producer, <-chan struct{})
	// Skip gives, for each case the producer cannot pass, the reason.
	Skip map[string]string
}

// Run runs every case of the conformance suite against h, each as a subtest
// of its own (named as the Case constants), in parallel.
func Run(t *testing.T, h Harness) {
	for _, name := range Cases {
		t.Run(name, func(t *testing.T) {
			if reason, ok := h.Skip[name]; ok {
				require.NotEmpty(t, reason, "a skipped case says why")
				t.Skipf("not applicable: %s", reason) // a documented gap, shown as such
				return
			}
			t.Parallel()
			cases[name](t, h)
		})
	}
}

var cases = map[string]func(*testing.T, Harness){
	CaseRoundTrip:          roundTrip,
	CaseOrder:              order,
	CaseTooLarge:           tooLarge,
	CaseUnknownDestination: unknownDestination,
	CaseBrokerDown:         brokerDown,
	CaseCloseDuringSend:    closeDuringSend,
	CaseAllOrNothing:       allOrNothing,
	CaseRefusedMidBatch:    refusedMidBatch,
	CaseSendWritesNothing:  sendWritesNothing,
}

func newProducer(t *testing.T, h Harness) producer.Producer {
	p := h.New(t)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

func sendCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// sendAll cuts msgs and sends each batch, as the sweeper does: rows a
// message-class error names, and rows it says were delivered, are left out
// and the rest of their batch is sent again. It returns the rows refused, in
// order.
func sendAll(t *testing.T, p producer.Producer, topic string, msgs []producer.Message) []int64 {
	t.Helper()
	ctx := sendCtx(t)
	batches, err := p.Batches(ctx, topic, msgs)
	var refused []int64
	if err != nil {
		require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "cutting %d messages of %s: %v", len(msgs), topic, err)
		refused = append(refused, producer.MessageIDs(err)...)
	}
	for _, b := range batches {
		for len(b.Messages) > 0 {
			err := p.Send(ctx, b)
			if err == nil {
				break
			}
			named := producer.MessageIDs(err)
			require.NotEmpty(t, named, "sending %d messages of %s: %v", len(b.Messages), topic, err)
			refused = append(refused, named...)
			gone := slices.Concat(named, producer.Delivered(err))
			b.Messages = slices.DeleteFunc(slices.Clone(b.Messages), func(m producer.Message) bool { return slices.Contains(gone, m.ID) })
		}
	}
	slices.Sort(refused)
	return refused
}

func message(topic string, id int64) producer.Message {
	return producer.Message{ID: id, MessageID: uuid.NewString(), Topic: topic,
		Payload: fmt.Appendf(nil, "body-%d", id), Headers: []byte(`{}`), PartitionKey: "key"}
}

func roundTrip(t *testing.T, h Harness) {
	topic := h.Topic(t)
	p := newProducer(t, h)
	m := producer.Message{ID: 1, MessageID: uuid.NewString(), Topic: topic,
		Payload:     []byte{0, 1, 2, 0x7f, 0x80, 0xfe, 0xff, '{', '"', '\n'},
		Headers:     []byte(`{"tenant":"acme","attempt":3,"big":12345678901234567890,"flags":{"a":true},"list":[1,"x"]}`),
		ContentType: "application/octet-stream", CorrelationID: "corr-1", PartitionKey: "customer-42",
		CreatedAt: time.Now()}
	require.Empty(t, sendAll(t, p, topic, []producer.Message{m}))
	got := h.Receive(t, topic, 1)[0]
	require.Equal(t, m.MessageID, got.MessageID, "message id")
	require.Equal(t, m.CorrelationID, got.CorrelationID, "correlation id")
	require.Equal(t, m.ContentType, got.ContentType, "content type")
	require.Equal(t, m.PartitionKey, got.PartitionKey, "partition key")
	require.Equal(t, m.Payload, got.Payload, "payload bytes")
	require.Equal(t, map[string]string{"tenant": "acme", "attempt": "3", "big": "12345678901234567890",
		"flags": `{"a":true}`, "list": `[1,"x"]`}, got.Headers, "headers")
}

func order(t *testing.T, h Harness) {
	topic := h.Topic(t)
	p := newProducer(t, h)
	var msgs []producer.Message
	for id := range int64(300) {
		msgs = append(msgs, message(topic, id+1))
	}
	require.Empty(t, sendAll(t, p, topic, msgs))
	got := h.Receive(t, topic, len(msgs))
	require.Len(t, got, len(msgs))
	for i, r := range got {
		require.Equal(t, msgs[i].MessageID, r.MessageID, "message %d of %d", i+1, len(msgs))
	}
}

func tooLarge(t *testing.T, h Harness) {
	topic := h.Topic(t)
	p := newProducer(t, h)
	msgs := []producer.Message{message(topic, 1), message(topic, 2), message(topic, 3)}
	h.Poison(t, p, &msgs[1])
	require.Equal(t, []int64{2}, sendAll(t, p, topic, msgs), "the poisoned row, and it alone, is named")
	got := h.Receive(t, topic, 2)
	require.Equal(t, []string{msgs[0].MessageID, msgs[2].MessageID}, []string{got[0].MessageID, got[1].MessageID})
}

func unknownDestination(t *testing.T, h Harness) {
	p := newProducer(t, h)
	topic := h.Unknown(t)
	err := sendOnce(t, p, topic, []producer.Message{message(topic, 1)})
	require.Error(t, err)
	require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
}

// sendOnce cuts msgs and sends the first batch, returning the first error.
func sendOnce(t *testing.T, p producer.Producer, topic string, msgs []producer.Message) error {
	ctx := sendCtx(t)
	batches, err := p.Batches(ctx, topic, msgs)
	if err != nil {
		return err
	}
	require.NotEmpty(t, batches)
	return p.Send(ctx, batches[0])
}

func brokerDown(t *testing.T, h Harness) {
	p := h.Down(t)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	err := sendOnce(t, p, "outbox.down", []producer.Message{message("outbox.down", 1)})
	require.Error(t, err)
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
	if c, ok := p.(producer.Checker); ok {
		err := c.Check(sendCtx(t))
		require.Error(t, err)
		require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "check: %v", err)
	}
}

func closeDuringSend(t *testing.T, h Harness) {
	topic := h.Topic(t)
	p, reached := h.Stuck(t, topic)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	done := make(chan error, 1)
	go func() {
		// No deadline: only Close can end it.
		m := message(topic, 2)
		done <- p.Send(context.Background(), producer.Batch{Topic: topic, Messages: []producer.Message{m}})
	}()
	select {
	case <-reached:
	case err := <-done:
		t.Fatalf("the send ended before Close: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the send never reached the broker")
	}
	if err := p.Close(context.Background()); err != nil {
		t.Logf("Close: %v", err) // a broker that hangs may not answer the close: the send must end all the same
	}
	select {
	case err := <-done:
		require.Error(t, err)
		require.NotEqual(t, producer.ClassMessage, producer.ClassOf(err), "a send Close ended blames no row: %v", err)
	case <-time.After(closeBound):
		t.Fatalf("Close did not end the send in flight within %s", closeBound)
	}
}

// closeBound is how long a send may take to end after Close: far more than
// a busy machine needs to deliver a closed channel, and less than the
// clients' own timeouts (NATS's ack timeout is 30 s), which would end it
// without Close.
const closeBound = 15 * time.Second

func allOrNothing(t *testing.T, h Harness) {
	topic := h.Topic(t)
	p := newProducer(t, h)
	batch := producer.Batch{Topic: topic, Messages: []producer.Message{message(topic, 1), message(topic, 2), message(topic, 3)}}
	h.Poison(t, p, &batch.Messages[1])
	err := p.Send(sendCtx(t), batch)
	require.Error(t, err)
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "%v", err)
	// Nothing of the batch arrived: a marker sent after it is the first
	// message of the topic (each producer keeps a topic's order).
	marker := message(topic, 4)
	require.Empty(t, sendAll(t, p, topic, []producer.Message{marker}))
	got := h.Receive(t, topic, 1)
	require.Equal(t, marker.MessageID, got[0].MessageID, "the first message to arrive is the marker: the failed batch sent nothing")
}

func refusedMidBatch(t *testing.T, h Harness) {
	topic := h.Topic(t)
	p := newProducer(t, h)
	msgs := []producer.Message{message(topic, 1), message(topic, 2), message(topic, 3), message(topic, 4), message(topic, 5)}
	h.Poison(t, p, &msgs[2])
	batch := producer.Batch{Topic: topic, Messages: msgs}
	err := p.Send(sendCtx(t), batch)
	require.Error(t, err)
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "%v", err)
	require.Equal(t, []int64{3}, producer.MessageIDs(err), "the refused row, and it alone, is named: %v", err)
	delivered := producer.Delivered(err)
	require.NotContains(t, delivered, int64(3), "the refused row is not delivered: %v", err)
	// The sweeper sends again what is neither refused nor delivered.
	rest := slices.DeleteFunc(slices.Clone(msgs), func(m producer.Message) bool { return m.ID == 3 || slices.Contains(delivered, m.ID) })
	if len(rest) > 0 {
		require.Empty(t, sendAll(t, p, topic, rest))
	}
	// Each good message once, in order, and then the marker: a second copy
	// of any would come before it.
	marker := message(topic, 6)
	require.Empty(t, sendAll(t, p, topic, []producer.Message{marker}))
	got := h.Receive(t, topic, 5)
	var ids []string
	for _, r := range got {
		ids = append(ids, r.MessageID)
	}
	require.Equal(t, []string{msgs[0].MessageID, msgs[1].MessageID, msgs[3].MessageID, msgs[4].MessageID, marker.MessageID}, ids,
		"every good message exactly once, in order (delivered before the failure: %v)", delivered)
}

func sendWritesNothing(t *testing.T, h Harness) {
	topic := h.Topic(t)
	p := newProducer(t, h)
	// A batch the caller built, whose messages Batches never saw: Send
	// builds each message's own form for itself.
	msgs := []producer.Message{message(topic, 1), message(topic, 2)}
	was := slices.Clone(msgs)
	require.NoError(t, p.Send(sendCtx(t), producer.Batch{Topic: topic, Messages: msgs}))
	require.Equal(t, was, msgs, "Send wrote into the messages of the batch it was given")
	// A batch Batches cut: Send takes what Batches left on its messages,
	// and leaves it there, and writes nothing into it either: two sends of
	// the batch at once (a send again, as the sweeper's, while the broker's
	// client still holds the first) race under -race if Send writes into
	// what Batches built.
	more := []producer.Message{message(topic, 3), message(topic, 4)}
	for i := range more {
		more[i].ExpiresAt = time.Now().Add(time.Hour) // a send sets the time left on its own copy
	}
	batches, err := p.Batches(sendCtx(t), topic, more)
	require.NoError(t, err)
	for _, b := range batches {
		was := slices.Clone(b.Messages)
		ctx, errs := sendCtx(t), make(chan error, 2)
		for range 2 {
			go func() { errs <- p.Send(ctx, b) }()
		}
		require.NoError(t, <-errs)
		require.NoError(t, <-errs)
		require.Equal(t, was, b.Messages, "Send wrote into the messages of a batch Batches cut")
		for i, m := range b.Messages {
			if was[i].Prepared != nil {
				require.Same(t, was[i].Prepared, m.Prepared, "Send replaced what Batches left on row %d", m.ID)
			}
		}
	}
	// The first batch arrived first; the two sends at once deliver theirs
	// once or twice, as the broker deduplicates or not.
	got := h.Receive(t, topic, 2)
	require.Equal(t, []string{msgs[0].MessageID, msgs[1].MessageID}, []string{got[0].MessageID, got[1].MessageID})
}

// HeaderText turns a row's headers column into Received.Headers' form, for
// harnesses whose broker hands the row's JSON back as it was.
func HeaderText(t *testing.T, headers []byte) map[string]string {
	t.Helper()
	var h map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(headers, &h))
	out := make(map[string]string, len(h))
	for k, v := range h {
		var s string
		if json.Unmarshal(v, &s) == nil {
			out[k] = s
			continue
		}
		out[k] = string(v)
	}
	return out
}

// ClosedAddr returns a loopback host:port nothing listens on, for a Down
// harness.
func ClosedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// Stalled is a Stuck harness for a broker reached by URL: it builds a
// producer with newProducer for brokerURL with its host through a proxy,
// sends one message of topic (connected), then stalls the proxy, and returns
// the producer and the proxy's Reached.
func Stalled(t *testing.T, brokerURL, topic string, newProducer func(t *testing.T, url string) producer.Producer) (producer.Producer, <-chan struct{}) {
	t.Helper()
	u, err := url.Parse(brokerURL)
	require.NoError(t, err)
	proxy := tcpproxy.New(t, u.Host)
	u.Host = proxy.Addr()
	p := newProducer(t, u.String())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, p.Send(ctx, producer.Batch{Topic: topic, Messages: Messages(topic, 1, 1)}))
	proxy.Stall(true)
	return p, proxy.Reached()
}
