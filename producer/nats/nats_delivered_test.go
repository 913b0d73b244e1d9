package nats_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/producer"
	outboxnats "github.com/outbox-sweeper/sweeper/producer/nats"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
)

// The tests below end a send while it waits for its acks, at a point they
// choose: the stream has taken rows 1-3 of 6 and acknowledged them, the send
// has taken those acks, and rows 4-6 are held on their way to the server. Each
// checks that the error names as delivered exactly the rows the stream holds,
// read back from it.

// A topic failure on one ack (the stream's subject removed while rows 4-6
// are held, so the server answers them "no responders", which the client
// turns into ErrNoStreamResponse after its retries) names the rows acked
// before it.
func TestTopicFailureWhileAwaitingAcksNamesTheRowsAckedBefore(t *testing.T) {
	t.Parallel()
	g := newGatedFixture(t)
	msgs := producertest.Messages(g.topic, 1, 6)
	g.gate.hold(msgIDs(msgs[3:])...)
	sent := g.send(context.Background(), msgs)
	g.waitAwaiting(t, msgs[3])

	g.moveSubject(t, g.prefix+"_moved.>")
	g.gate.release(msgIDs(msgs[3:])...)
	err := g.result(t, sent)
	require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
	require.Equal(t, "no_stream", producer.ReasonOf(err))
	require.Empty(t, producer.MessageIDs(err), "a topic failure blames no row")
	requireDeliveredIsStored(t, g.fixture, msgs, err, []int64{1, 2, 3})
}

// A send whose context ends while it waits for acks names the rows acked
// before: cancelled (the sweeper stopping: local class) or past its deadline
// (--send-timeout: transient).
func TestContextEndWhileAwaitingAcksNamesTheRowsAcked(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		class producer.Class
		cause error
	}{
		{"cancelled", producer.ClassLocal, context.Canceled},
		{"deadline", producer.ClassTransient, context.DeadlineExceeded},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			g := newGatedFixture(t)
			msgs := producertest.Messages(g.topic, 1, 6)
			g.gate.hold(msgIDs(msgs[3:])...)
			ctx := newEndable(c.cause)
			sent := g.send(ctx, msgs)
			g.waitAwaiting(t, msgs[3])

			ctx.end()
			err := g.result(t, sent)
			require.Equal(t, c.class, producer.ClassOf(err), "%v", err)
			require.ErrorIs(t, err, c.cause)
			require.ErrorContains(t, err, fmt.Sprintf("waiting for 6 JetStream acks on %q", g.topic))
			requireDeliveredIsStored(t, g.fixture, msgs, err, []int64{1, 2, 3})
		})
	}
}

// Close ends a send waiting for acks with a local error (its rows stay
// outstanding, no attempt counted) that names the rows acked before. Closing
// the connection does not fail the futures (the client fails them on a
// reconnect only): the send ends on the producer's own signal.
func TestCloseWhileAwaitingAcksNamesTheRowsAcked(t *testing.T) {
	t.Parallel()
	g := newGatedFixture(t)
	msgs := producertest.Messages(g.topic, 1, 6)
	g.gate.hold(msgIDs(msgs[3:])...)
	sent := g.send(context.Background(), msgs) // no deadline: only Close ends it
	g.waitAwaiting(t, msgs[3])

	require.NoError(t, g.p.Close(context.Background()))
	err := g.result(t, sent)
	require.Equal(t, producer.ClassLocal, producer.ClassOf(err), "%v", err)
	require.NotErrorIs(t, err, context.Canceled, "the producer's own local error, not a context's")
	require.ErrorContains(t, err, fmt.Sprintf("nats producer closed while 6 JetStream acks on %q were awaited", g.topic))
	requireDeliveredIsStored(t, g.fixture, msgs, err, []int64{1, 2, 3})
}

// Send returns at the first topic failure without waiting for the later
// acks: rows the stream takes after it (here the subject comes back before
// rows 4 and 5 reach the server) are stored but not named delivered. Naming
// fewer than the stream took is safe: the sweeper sends them again, and
// JetStream drops the copies by Nats-Msg-Id, as long as they come within the
// stream's duplicate window (two minutes by default) and to the same stream.
func TestAcksAfterATopicFailureAreNotClaimedAndTheirResendIsDropped(t *testing.T) {
	t.Parallel()
	g := newGatedFixture(t)
	msgs := producertest.Messages(g.topic, 1, 5)
	g.gate.hold(msgIDs(msgs[2:])...)
	sent := g.send(context.Background(), msgs)
	g.waitAwaiting(t, msgs[2])

	g.moveSubject(t, g.prefix+"_moved.>")
	g.gate.release(msgs[2].MessageID)
	// Row 3 has failed once the send returns, or once it waits for row 4
	// (were it to wait for every ack after a topic failure, this test would
	// then fail on Delivered below, not hang).
	var err error
	returned := false
	for waiting := true; waiting; {
		select {
		case err = <-sent:
			returned, waiting = true, false
		case id := <-g.awaiting:
			waiting = id != msgs[3].MessageID
		case <-time.After(time.Minute):
			t.Fatal("row 3 never failed")
		}
	}

	g.moveSubject(t, g.topic)
	g.gate.release(msgIDs(msgs[3:])...)
	if !returned {
		err = g.result(t, sent)
	}
	require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
	require.Equal(t, []int64{1, 2}, producer.Delivered(err), "Send returned at row 3's topic failure, without the later acks")
	require.Equal(t, []int64{1, 2, 4, 5}, storedRows(t, g.fixture, msgs, 4),
		"rows 4 and 5 are stored, though the error did not name them")

	// The sweeper sends again what the error did not name delivered.
	rest := slices.DeleteFunc(slices.Clone(msgs), func(m producer.Message) bool { return slices.Contains(producer.Delivered(err), m.ID) })
	require.NoError(t, g.p.Send(context.Background(), producer.Batch{Topic: g.topic, Messages: rest}))
	require.Equal(t, []int64{1, 2, 4, 5, 3}, storedRows(t, g.fixture, msgs, 5), "each row once: the copies of 4 and 5 were dropped")
	info, err := g.stream.Info(context.Background())
	require.NoError(t, err)
	require.Equal(t, uint64(5), info.State.Msgs)
}

// requireDeliveredIsStored checks that err names as delivered exactly want,
// and that the stream holds exactly those rows: none named that it lacks,
// none stored that is not named. The rows the tests hold never reach the
// server, so the stream cannot take more after this reads it.
func requireDeliveredIsStored(t *testing.T, f *fixture, msgs []producer.Message, err error, want []int64) {
	t.Helper()
	delivered := producer.Delivered(err)
	require.Equal(t, want, delivered, "%v", err)
	stored := storedRows(t, f, msgs, -1)
	for _, id := range delivered {
		require.Contains(t, stored, id, "row %d is named delivered, and the stream does not hold it", id)
	}
	require.Equal(t, delivered, stored, "the stream holds exactly the rows named delivered")
}

// storedRows reads the stream back and returns its rows in stream order, each
// known by its Nats-Msg-Id and checked against its body. It waits for n
// messages; n < 0 takes the count the stream says it holds.
func storedRows(t *testing.T, f *fixture, msgs []producer.Message, n int) []int64 {
	t.Helper()
	byMsgID := map[string]producer.Message{}
	for _, m := range msgs {
		byMsgID[m.MessageID] = m
	}
	if n < 0 {
		info, err := f.stream.Info(context.Background())
		require.NoError(t, err)
		n = int(info.State.Msgs)
	}
	var rows []int64
	if n > 0 {
		for _, sm := range f.stored(t, n) {
			m, ok := byMsgID[sm.Headers().Get(natsgo.MsgIdHdr)]
			require.True(t, ok, "the stream holds a message of no row: %q", sm.Headers().Get(natsgo.MsgIdHdr))
			require.Equal(t, string(m.Payload), string(sm.Data()), "row %d's body", m.ID)
			rows = append(rows, m.ID)
		}
	}
	info, err := f.stream.Info(context.Background())
	require.NoError(t, err)
	require.Equal(t, uint64(len(rows)), info.State.Msgs, "the stream holds %d messages; read back %v", info.State.Msgs, rows)
	return rows
}

func msgIDs(msgs []producer.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.MessageID
	}
	return out
}

// gatedFixture is a fixture whose producer reaches the server through a
// gate, tells which ack its sends wait for (outboxnats.WatchAcks), and whose
// stream's subjects the test can change.
type gatedFixture struct {
	*fixture
	topic    string
	gate     *gate
	js       jetstream.JetStream // the test's own, to change the stream
	awaiting chan string
}

func newGatedFixture(t *testing.T) *gatedFixture {
	t.Helper()
	url := brokertest.NATSURL(t)
	gt := newGate(t, brokertest.HostPort(t, url))
	// An ack timeout far past the test: a held row's future fails only as the
	// test makes it.
	f := setup(t, outboxnats.Config{URL: brokertest.WithHost(t, url, gt.addr()), AckTimeout: time.Hour}, jetstream.StreamConfig{})
	g := &gatedFixture{fixture: f, topic: f.subject("t"), gate: gt, awaiting: make(chan string, 1024)}
	outboxnats.WatchAcks(f.p, func(msgID string) {
		select {
		case g.awaiting <- msgID:
		default: // far more than a test's sends wait for; never blocks a send
		}
	})
	nc, err := natsgo.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	g.js, err = jetstream.New(nc)
	require.NoError(t, err)
	return g
}

// send sends msgs in a goroutine of its own, in a batch of its own.
func (g *gatedFixture) send(ctx context.Context, msgs []producer.Message) <-chan error {
	sent := make(chan error, 1)
	b := producer.Batch{Topic: g.topic, Messages: slices.Clone(msgs)}
	go func() { sent <- g.p.Send(ctx, b) }()
	return sent
}

// waitAwaiting waits until the send waits for m's ack: it has taken the acks
// of the rows before m.
func (g *gatedFixture) waitAwaiting(t *testing.T, m producer.Message) {
	t.Helper()
	for {
		select {
		case id := <-g.awaiting:
			if id == m.MessageID {
				return
			}
		case <-time.After(time.Minute):
			t.Fatalf("the send never waited for row %d's ack", m.ID)
		}
	}
}

func (g *gatedFixture) result(t *testing.T, sent <-chan error) error {
	t.Helper()
	select {
	case err := <-sent:
		require.Error(t, err)
		return err
	case <-time.After(time.Minute):
		t.Fatal("the send did not end")
		return nil
	}
}

// moveSubject makes the stream capture subject instead of what it did.
func (g *gatedFixture) moveSubject(t *testing.T, subject string) {
	t.Helper()
	info, err := g.stream.Info(context.Background())
	require.NoError(t, err)
	cfg := info.Config
	cfg.Subjects = []string{subject}
	_, err = g.js.UpdateStream(context.Background(), cfg)
	require.NoError(t, err)
}

// endable is a context that ends when the test calls end, with cause as its
// Err. A deadline on the clock could pass before the send took the acks that
// had come in; a send that finds an ack and its context's end both ready
// picks one at random, and would name fewer rows than the stream took.
type endable struct {
	context.Context // Background: no values, no deadline
	cause           error
	done            chan struct{}
	once            sync.Once
}

func newEndable(cause error) *endable {
	return &endable{Context: context.Background(), cause: cause, done: make(chan struct{})}
}

func (c *endable) end()                  { c.once.Do(func() { close(c.done) }) }
func (c *endable) Done() <-chan struct{} { return c.done }

func (c *endable) Err() error {
	select {
	case <-c.done:
		return c.cause
	default:
		return nil
	}
}

// gate is a proxy between a NATS client and the server that holds the
// client's publishes of chosen messages (by Nats-Msg-Id) until the test
// releases them, and forwards everything else as it comes (pings too, so the
// connection stays up). A held message has not reached the server, so no
// stream can have it; a connection that ends drops what it held. Unlike
// tcpproxy's Stall it holds some messages of a batch and not the others.
type gate struct {
	target string
	ln     net.Listener

	mu      sync.Mutex // also orders the writes to the server
	holding map[string]bool
	held    []heldPub
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

type heldPub struct {
	msgID    string
	frame    []byte
	upstream net.Conn
}

func newGate(t *testing.T, target string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := &gate{target: target, ln: ln, holding: map[string]bool{}, conns: map[net.Conn]struct{}{}}
	g.wg.Add(1)
	go g.accept()
	t.Cleanup(g.close)
	return g
}

func (g *gate) addr() string { return g.ln.Addr().String() }

// hold makes the gate keep the publishes of these message ids.
func (g *gate) hold(msgIDs ...string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, id := range msgIDs {
		g.holding[id] = true
	}
}

// release forwards the held publishes of these message ids, in the order
// they came, and lets their later ones (the client's retries) through.
func (g *gate) release(msgIDs ...string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, id := range msgIDs {
		delete(g.holding, id)
	}
	g.held = slices.DeleteFunc(g.held, func(h heldPub) bool {
		if !slices.Contains(msgIDs, h.msgID) {
			return false
		}
		_, _ = h.upstream.Write(h.frame) // a connection gone: the message is lost, as it would be
		return true
	})
}

func (g *gate) close() {
	_ = g.ln.Close()
	g.mu.Lock()
	for c := range g.conns {
		_ = c.Close()
	}
	g.held = nil
	g.mu.Unlock()
	g.wg.Wait()
}

func (g *gate) accept() {
	defer g.wg.Done()
	for {
		client, err := g.ln.Accept()
		if err != nil {
			return // closed
		}
		upstream, err := net.Dial("tcp", g.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		g.mu.Lock()
		g.conns[client], g.conns[upstream] = struct{}{}, struct{}{}
		g.mu.Unlock()
		g.wg.Add(2)
		go func() {
			defer g.wg.Done()
			_, _ = io.Copy(client, upstream)
			g.drop(client, upstream)
		}()
		go func() {
			defer g.wg.Done()
			g.forward(client, upstream)
			g.drop(client, upstream)
		}()
	}
}

// forward copies the client's protocol to the server frame by frame, keeping
// the publishes it holds.
func (g *gate) forward(client, upstream net.Conn) {
	r := bufio.NewReader(client)
	for {
		frame, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var msgID string
		// PUB subject [reply] size and HPUB subject [reply] hdr_size total_size
		// are followed by size bytes and CRLF.
		if f := strings.Fields(string(frame)); len(f) > 0 && (strings.EqualFold(f[0], "PUB") || strings.EqualFold(f[0], "HPUB")) {
			size, err := strconv.Atoi(f[len(f)-1])
			if err != nil {
				return
			}
			body := make([]byte, size+2)
			if _, err := io.ReadFull(r, body); err != nil {
				return
			}
			if strings.EqualFold(f[0], "HPUB") {
				if hdrSize, err := strconv.Atoi(f[len(f)-2]); err == nil && hdrSize <= size {
					msgID = headerValue(body[:hdrSize], natsgo.MsgIdHdr)
				}
			}
			frame = append(frame, body...)
		}
		g.mu.Lock()
		if msgID != "" && g.holding[msgID] {
			g.held = append(g.held, heldPub{msgID: msgID, frame: frame, upstream: upstream})
			g.mu.Unlock()
			continue
		}
		_, err = upstream.Write(frame)
		g.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (g *gate) drop(conns ...net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
		delete(g.conns, c)
	}
	g.held = slices.DeleteFunc(g.held, func(h heldPub) bool { return slices.Contains(conns, h.upstream) })
}

// headerValue returns the value of header name in a NATS header block
// ("NATS/1.0\r\nName: value\r\n...\r\n\r\n").
func headerValue(block []byte, name string) string {
	for line := range bytes.SplitSeq(block, []byte("\r\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if ok && strings.EqualFold(string(k), name) {
			return strings.TrimSpace(string(v))
		}
	}
	return ""
}
