package nats_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/producer"
	outboxnats "github.com/outbox-sweeper/sweeper/producer/nats"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
	"github.com/outbox-sweeper/sweeper/test/tcpproxy"
)

// fixture is a stream of the test's own capturing prefix.>, and a producer.
type fixture struct {
	prefix string
	p      *outboxnats.Producer
	stream jetstream.Stream
}

func setup(t testing.TB, cfg outboxnats.Config, streamCfg jetstream.StreamConfig) *fixture {
	t.Helper()
	url := brokertest.NATSURL(t)
	f := &fixture{prefix: brokertest.Name("outbox")}
	nc, err := natsgo.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	streamCfg.Name = f.prefix
	streamCfg.Subjects = []string{f.prefix + ".>"}
	f.stream = brokertest.CreateStream(t, js, streamCfg)

	if cfg.URL == "" {
		cfg.URL = url
	}
	f.p, err = outboxnats.New(cfg)
	require.NoError(t, err)
	require.NoError(t, f.p.Connect(ctx))
	t.Cleanup(func() { _ = f.p.Close(context.Background()) })
	return f
}

func (f *fixture) subject(s string) string { return f.prefix + "." + s }

// stored returns the messages the stream holds, in order.
func (f *fixture) stored(t *testing.T, n int) []jetstream.Msg {
	t.Helper()
	ctx := context.Background()
	c, err := f.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	var out []jetstream.Msg
	for len(out) < n {
		// The fetch returns as soon as the messages are in; the wait only
		// bounds a stream that lacks some.
		batch, err := c.Fetch(n-len(out), jetstream.FetchMaxWait(30*time.Second))
		require.NoError(t, err)
		got := 0
		for m := range batch.Messages() {
			out = append(out, m)
			got++
		}
		require.NotZero(t, got, "the stream holds %d of %d messages", len(out), n)
	}
	return out
}

func TestSendMapsEveryField(t *testing.T) {
	t.Parallel()
	f := setup(t, outboxnats.Config{}, jetstream.StreamConfig{})
	subj := f.subject("orders")
	m := producer.Message{
		ID: 1, MessageID: "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22", Topic: subj, Payload: []byte{0, 1, 0xff},
		Headers: []byte(`{"tenant":"acme","n":2,"nested":{"a":1},"big":1234567890123456789}`), ContentType: "application/json",
		CorrelationID: "req-1", PartitionKey: "order-42",
	}
	batch := producer.Batch{Topic: subj, Messages: []producer.Message{m}}
	require.NoError(t, f.p.Send(context.Background(), batch))
	// The batch's messages are the caller's: Send builds its own without
	// writing into them (only Batches sets Prepared).
	require.Nil(t, batch.Messages[0].Prepared, "Send wrote into its caller's message")
	got := f.stored(t, 1)[0]
	require.Equal(t, subj, got.Subject())
	require.Equal(t, m.Payload, got.Data())
	h := got.Headers()
	require.Equal(t, m.MessageID, h.Get("Nats-Msg-Id"))
	require.Equal(t, "acme", h.Get("tenant"))
	require.Equal(t, "2", h.Get("n"))
	require.Equal(t, "1234567890123456789", h.Get("big"))
	require.Equal(t, `{"a":1}`, h.Get("nested"))
	require.Equal(t, "application/json", h.Get("Content-Type"))
	require.Equal(t, "req-1", h.Get("Correlation-Id"))
	require.Equal(t, "order-42", h.Get("Partition-Key"))
}

// The same batch published twice (a redelivery after a lost commit) is stored
// once: JetStream de-duplicates by Nats-Msg-Id.
func TestRedeliveredBatchIsDeduplicated(t *testing.T) {
	t.Parallel()
	f := setup(t, outboxnats.Config{}, jetstream.StreamConfig{})
	subj := f.subject("t")
	batch := producer.Batch{Topic: subj, Messages: producertest.Messages(subj, 1, 50)}
	require.NoError(t, f.p.Send(context.Background(), batch))
	require.NoError(t, f.p.Send(context.Background(), batch))
	info, err := f.stream.Info(context.Background())
	require.NoError(t, err)
	require.Equal(t, uint64(50), info.State.Msgs)
	for i, m := range f.stored(t, 50) {
		require.Equal(t, fmt.Sprintf("body-%d", i+1), string(m.Data()))
	}
}

func TestSubjectWithoutStreamIsTopicClass(t *testing.T) {
	t.Parallel()
	for _, refresh := range []time.Duration{0, -1} { // the stream list's answer, and JetStream's
		t.Run(fmt.Sprint("refresh=", refresh), func(t *testing.T) {
			t.Parallel()
			f := setup(t, outboxnats.Config{StreamsRefresh: refresh}, jetstream.StreamConfig{})
			subj := brokertest.Name("nostream") + ".t"
			err := f.p.Send(context.Background(), producer.Batch{Topic: subj, Messages: producertest.Messages(subj, 1, 3)})
			require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
			require.Equal(t, "no_stream", producer.ReasonOf(err))
			require.ErrorContains(t, err, "create a stream whose subjects include this one")
		})
	}
}

// A stream's max_msg_size rejects the large message only; the sweeper gets the
// row named and sends the others.
func TestMessageOverStreamLimitIsMessageClass(t *testing.T) {
	t.Parallel()
	f := setup(t, outboxnats.Config{}, jetstream.StreamConfig{MaxMsgSize: 100})
	subj := f.subject("t")
	batch := producer.Batch{Topic: subj, Messages: producertest.Messages(subj, 1, 3)}
	batch.Messages[1].Payload = make([]byte, 200)
	err := f.p.Send(context.Background(), batch)
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "%v", err)
	require.Equal(t, []int64{2}, producer.MessageIDs(err))
}

// A stream at its limit that discards new messages refuses each one past it:
// topic class, naming what it took, so that the rows wait for the stream
// rather than count attempts and go to the dead-letter table.
func TestAFullStreamIsTopicClass(t *testing.T) {
	t.Parallel()
	for _, cfg := range []jetstream.StreamConfig{
		{MaxMsgs: 1, Discard: jetstream.DiscardNew},
		{MaxBytes: 1000, Discard: jetstream.DiscardNew},
		{MaxMsgsPerSubject: 1, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true},
	} {
		f := setup(t, outboxnats.Config{}, cfg)
		subj := f.subject("t")
		msgs := producertest.Messages(subj, 1, 3)
		for i := range msgs {
			msgs[i].Payload = make([]byte, 600) // one fits in 1,000 bytes, two do not
		}
		err := f.p.Send(context.Background(), producer.Batch{Topic: subj, Messages: msgs})
		require.Error(t, err, "%+v", cfg)
		require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%+v: %v", cfg, err)
		require.Equal(t, "stream_full", producer.ReasonOf(err))
		require.ErrorContains(t, err, "exceeded")
		require.Equal(t, []int64{1}, producer.Delivered(err), "%+v: the message the stream took is named delivered", cfg)
	}
}

// Issue 34's case: a stream that refuses messages over 1 KiB, 40 rows of one
// topic, row 20 of 4 KiB. The error names row 20 and says the stream took
// the 39 others, so the sweeper sends none of them again: a core
// subscription, which no duplicate window hides anything from, counts each
// once.
func TestARefusalMidBatchNamesWhatTheStreamTook(t *testing.T) {
	t.Parallel()
	f := setup(t, outboxnats.Config{}, jetstream.StreamConfig{MaxMsgSize: 1024})
	subj := f.subject("t")
	nc, err := natsgo.Connect(brokertest.NATSURL(t))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	seen := make(chan string, 100)
	sub, err := nc.Subscribe(subj, func(m *natsgo.Msg) { seen <- m.Header.Get(natsgo.MsgIdHdr) })
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	msgs := producertest.Messages(subj, 1, 40)
	msgs[19].Payload = make([]byte, 4096)
	err = f.p.Send(context.Background(), producer.Batch{Topic: subj, Messages: msgs})
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "%v", err)
	require.Equal(t, []int64{20}, producer.MessageIDs(err))
	var want []int64
	for id := int64(1); id <= 40; id++ {
		if id != 20 {
			want = append(want, id)
		}
	}
	require.Equal(t, want, producer.Delivered(err), "every acknowledged message is named delivered")

	// The sweeper resends what is neither refused nor delivered: nothing.
	// A marker sent after the batch ends the count.
	marker := producertest.Messages(subj, 41, 41)
	require.NoError(t, f.p.Send(context.Background(), producer.Batch{Topic: subj, Messages: marker}))
	count := map[string]int{}
	for done := false; !done; {
		select {
		case id := <-seen:
			count[id]++
			done = id == marker[0].MessageID
		case <-time.After(time.Minute):
			t.Fatalf("the marker never arrived; counted %d messages", len(count))
		}
	}
	for _, m := range msgs {
		if m.ID != 20 {
			require.Equal(t, 1, count[m.MessageID], "row %d published once", m.ID)
		}
	}
}

func TestBatchesRejectMessagesOverMaxPayload(t *testing.T) {
	t.Parallel()
	f := setup(t, outboxnats.Config{MaxBatch: 2}, jetstream.StreamConfig{})
	subj := f.subject("t")
	in := producertest.Messages(subj, 1, 5)
	in[2].Payload = make([]byte, 2<<20) // the server's max_payload is 1 MiB
	batches, err := f.p.Batches(context.Background(), subj, in)
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err))
	require.Equal(t, []int64{3}, producer.MessageIDs(err))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.RowReason(err, 3))
	require.ErrorContains(t, err, "row 3: message of about 2097286 bytes is over the NATS server's max_payload of 1048576")
	require.Len(t, batches, 2)
	require.Equal(t, []int64{1, 2}, batches[0].IDs())
	require.Equal(t, []int64{4, 5}, batches[1].IDs())
}

func TestInvalidHeadersAreMessageClass(t *testing.T) {
	t.Parallel()
	f := setup(t, outboxnats.Config{}, jetstream.StreamConfig{})
	subj := f.subject("t")
	batch := producer.Batch{Topic: subj, Messages: producertest.Messages(subj, 1, 2)}
	batch.Messages[0].Headers = []byte(`"x"`)
	err := f.p.Send(context.Background(), batch)
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err))
	require.Equal(t, []int64{1}, producer.MessageIDs(err))

	// JetStream's own control headers never come from a row.
	batch = producer.Batch{Topic: subj, Messages: producertest.Messages(subj, 1, 2)}
	batch.Messages[1].Headers = []byte(`{"Nats-Rollup":"all"}`)
	err = f.p.Send(context.Background(), batch)
	require.Equal(t, []int64{2}, producer.MessageIDs(err))
	require.ErrorContains(t, err, "Nats-* headers are reserved")
}

// The connection drops: sends fail as transient or are buffered across the
// reconnect, and once it is back every message is stored exactly once.
func TestConnectionCutLosesNothing(t *testing.T) {
	t.Parallel()
	url := brokertest.NATSURL(t)
	proxy := tcpproxy.New(t, brokertest.HostPort(t, url))
	f := setup(t, outboxnats.Config{URL: brokertest.WithHost(t, url, proxy.Addr())}, jetstream.StreamConfig{})
	subj := f.subject("t")
	failures := 0
	for i := range 20 {
		batch := producer.Batch{Topic: subj, Messages: producertest.Messages(subj, i*10+1, 10)}
		if i == 5 {
			proxy.Cut()
		}
		// Sent again until it goes, as the sweeper would; the client
		// reconnects by itself meanwhile.
		deadline := time.Now().Add(time.Minute)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := f.p.Send(ctx, batch)
			cancel()
			if err == nil {
				break
			}
			failures++
			require.NotEqual(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
			require.True(t, time.Now().Before(deadline), "never recovered: %v", err)
		}
	}
	info, err := f.stream.Info(context.Background())
	require.NoError(t, err)
	require.Equal(t, uint64(200), info.State.Msgs, "every message once, retries de-duplicated")
	t.Logf("%d sends failed across the cut", failures)
}

func TestServerDownIsBrokerClassAndClosedIsLocal(t *testing.T) {
	t.Parallel()
	proxy := tcpproxy.New(t, brokertest.HostPort(t, brokertest.NATSURL(t)))
	proxy.Refuse(true)
	p, err := outboxnats.New(outboxnats.Config{URL: brokertest.WithHost(t, brokertest.NATSURL(t), proxy.Addr()), ConnectTimeout: time.Second})
	require.NoError(t, err)
	err = p.Send(context.Background(), producer.Batch{Topic: "x", Messages: producertest.Messages("x", 1, 1)})
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
	require.Equal(t, "connection_lost", producer.ReasonOf(err))
	require.True(t, strings.Contains(err.Error(), "connect to NATS"), err.Error())
	require.NoError(t, p.Close(context.Background()))
	err = p.Send(context.Background(), producer.Batch{Topic: "x", Messages: producertest.Messages("x", 1, 1)})
	require.Equal(t, producer.ClassLocal, producer.ClassOf(err))
	_, err = outboxnats.New(outboxnats.Config{})
	require.ErrorContains(t, err, "no URL (--nats-url)")
	require.False(t, errors.Is(err, context.Canceled))
}

// A server that accepts and then says nothing: a send ends by its own deadline,
// not by the much longer ConnectTimeout, and Close does not wait for the
// connection attempt in progress. ConnectTimeout is an hour, so a send or a
// Close that waited for it would hold the test far past the generous bounds
// below, which only a working one meets.
func TestHungServerEndsTheSendByItsDeadlineAndCloseDoesNotWait(t *testing.T) {
	t.Parallel()
	proxy := tcpproxy.New(t, brokertest.HostPort(t, brokertest.NATSURL(t)))
	proxy.Hang(true)
	p, err := outboxnats.New(outboxnats.Config{URL: brokertest.WithHost(t, brokertest.NATSURL(t), proxy.Addr()), ConnectTimeout: time.Hour})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	sent := make(chan error, 1)
	go func() { sent <- p.Send(ctx, producer.Batch{Topic: "x", Messages: producertest.Messages("x", 1, 1)}) }()
	select {
	case err := <-sent:
		require.Error(t, err)
		require.NotEqual(t, producer.ClassTopic, producer.ClassOf(err))
	case <-time.After(time.Minute):
		t.Fatal("the send's deadline did not bound the connection attempt")
	}

	// A connection attempt without a deadline is in progress (the proxy has
	// taken its connection, which hangs); Close returns anyway. The send made
	// one attempt: count it in first, however late the proxy takes it.
	require.Eventually(t, func() bool { return proxy.Accepts() >= 1 }, time.Minute, 5*time.Millisecond)
	accepted := proxy.Accepts()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Connect(context.Background())
	}()
	require.Eventually(t, func() bool { return proxy.Accepts() > accepted }, time.Minute, 5*time.Millisecond,
		"the connection attempt never reached the server")
	closed := make(chan error, 1)
	go func() { closed <- p.Close(context.Background()) }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Close waited for the connection attempt")
	}
	select {
	case <-done:
		t.Fatal("the connection attempt ended before the test ended it: Close did not run while it was in progress")
	default:
	}
	proxy.Cut() // ends the hung attempt
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the connection attempt never ended")
	}
}

// Before any server answered, the producer does not know max_payload: it cuts
// without a size check rather than guess one (a server may allow more than the
// 1 MiB default), and leaves a too-large message to the send.
func TestBatchesBeforeAnyServerAnsweredChecksNoSize(t *testing.T) {
	t.Parallel()
	proxy := tcpproxy.New(t, brokertest.HostPort(t, brokertest.NATSURL(t)))
	proxy.Refuse(true)
	p, err := outboxnats.New(outboxnats.Config{URL: brokertest.WithHost(t, brokertest.NATSURL(t), proxy.Addr()), ConnectTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	msgs := producertest.Messages("x", 1, 2)
	msgs[0].Payload = make([]byte, 2<<20)
	batches, err := p.Batches(context.Background(), "x", msgs)
	require.NoError(t, err, "cutting needs no server")
	require.Len(t, batches, 1)
	require.Len(t, batches[0].Messages, 2)
}
