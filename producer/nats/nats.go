// Package nats is a producer that publishes outbox messages to NATS JetStream.
//
// The topic is the subject; a stream must capture it. Each message carries its
// message id as Nats-Msg-Id, so JetStream drops a redelivered copy within the
// stream's duplicate window (two minutes by default). A batch is published
// asynchronously and every acknowledgement is awaited before Send returns.
//
// Mapping: headers become NATS headers (strings as they are, other JSON values as
// their JSON text), content_type → Content-Type, correlation_id → Correlation-Id,
// partition_key → Partition-Key, message_id → Nats-Msg-Id.
//
// Failure classes: a subject no stream captures is topic-class, refused before
// it is published when the producer's copy of the stream list says so (see
// streams.go), else when JetStream answers "no response from stream"; a message over the server's max_payload or the stream's
// max_msg_size is message-class; a connection that cannot be opened, or is
// lost or reconnecting, is broker-class ("connection_lost"), which never counts
// against the rows; a timeout or a stream that is full is transient.
//
// Batches checks every row before anything is sent (see validate.go): a
// subject that is not a valid literal NATS subject, or too long for the
// protocol line, fails the topic; a header name that is not a token, a header
// value with a line break, or a Nats-* header fails the row alone. The server
// closes the shared connection on some of these.
package nats

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outbox-sweeper/sweeper/producer"
)

// Defaults for [Config].
const (
	MaxBatchDefault     = 500
	ConnectTimeDefault  = 10 * time.Second
	AckTimeoutDefault   = 30 * time.Second
	headerContentType   = "Content-Type"
	headerCorrelationID = "Correlation-Id"
	headerPartitionKey  = "Partition-Key"
)

// Config configures a [Producer].
type Config struct {
	// URL is the NATS server URL (several may be given, separated by commas).
	// Required.
	URL string
	// MaxBatch is the most messages published before their acks are awaited.
	// Defaults to MaxBatchDefault.
	MaxBatch int
	// ConnectTimeout bounds connecting. Defaults to ConnectTimeDefault.
	ConnectTimeout time.Duration
	// AckTimeout is how long the client keeps waiting for one message's ack
	// before it gives up on it; a Send's own context usually ends sooner.
	// Defaults to AckTimeoutDefault.
	AckTimeout time.Duration
	// StreamsRefresh is how often the producer reads again the list of the
	// account's streams, whose subjects it keeps so as to refuse at once, as
	// topic-class no_stream, a subject no stream captures, where a publish
	// would wait about half a second for JetStream to say so. A subject the
	// list does not capture makes it read the list again first, at most once
	// a second, so a stream just created is seen. Defaults to
	// StreamsRefreshDefault; negative turns the check off, for subjects a
	// stream captures through an account import or a subject mapping, which
	// the account's own list does not show.
	StreamsRefresh time.Duration
}

// Producer publishes to JetStream. It is safe for concurrent use.
type Producer struct {
	cfg Config

	dial   chan struct{} // one connect at a time: a slot, so waiting heeds ctx; outside mu so Close never waits for it
	mu     sync.Mutex
	nc     *natsgo.Conn
	js     jetstream.JetStream
	closed bool
	// done is closed by Close, to end the sends waiting for acks: closing the
	// connection does not fail their futures, which would wait for AckTimeout.
	done chan struct{}
	// maxPayload is the server's max_payload as last seen, for cutting batches
	// while not connected.
	maxPayload atomic.Int64
	// streams knows which subjects the streams capture (streams.go).
	streams *streams
}

var (
	_ producer.Producer     = (*Producer)(nil)
	_ producer.Checker      = (*Producer)(nil)
	_ producer.TopicChecker = (*Producer)(nil)
)

// New returns a producer; it connects on [Producer.Connect] or first use, so a
// server that is down at start is waited for, not fatal.
func New(cfg Config) (*Producer, error) {
	if cfg.URL == "" {
		return nil, errors.New("nats: no URL (--nats-url)")
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = MaxBatchDefault
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = ConnectTimeDefault
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = AckTimeoutDefault
	}
	return &Producer{cfg: cfg, dial: make(chan struct{}, 1), done: make(chan struct{}), streams: newStreams(cfg.StreamsRefresh)}, nil
}

// Connect connects, so that a start-up can report a server it cannot reach.
func (p *Producer) Connect(ctx context.Context) error {
	_, _, err := p.conn(ctx)
	return err
}

// conn returns the connection, connecting first if needed, within
// ConnectTimeout or ctx's deadline, whichever comes first: a server that is down
// or hangs must not hold a send past --send-timeout. Once connected, the client
// reconnects by itself, buffering publishes meanwhile.
func (p *Producer) conn(ctx context.Context) (*natsgo.Conn, jetstream.JetStream, error) {
	select {
	case p.dial <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("wait for the connection to NATS: %w", ctx.Err())
	}
	defer func() { <-p.dial }()
	p.mu.Lock()
	closed, nc, js := p.closed, p.nc, p.js
	p.mu.Unlock()
	if closed {
		return nil, nil, producer.NewLocalError(errors.New("nats producer is closed"))
	}
	if nc != nil && !nc.IsClosed() {
		return nc, js, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	timeout := p.cfg.ConnectTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if timeout <= 0 {
		return nil, nil, producer.NewBrokerError("connection_lost", fmt.Errorf("connect to NATS at %s: no time left before the send's deadline", redactURLs(p.cfg.URL)))
	}
	nc, err := natsgo.Connect(p.cfg.URL,
		natsgo.Name("outbox-sweeper"),
		natsgo.Timeout(timeout),
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(500*time.Millisecond),
	)
	if err != nil {
		return nil, nil, producer.NewBrokerError("connection_lost", fmt.Errorf("connect to NATS at %s: %w", redactURLs(p.cfg.URL), err))
	}
	js, err = jetstream.New(nc,
		// Every topic in flight publishes on this one context: room for many
		// batches, so a slow ack on one topic does not stall the others.
		jetstream.WithPublishAsyncMaxPending(64*p.cfg.MaxBatch),
		jetstream.WithPublishAsyncTimeout(p.cfg.AckTimeout),
	)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("JetStream context: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		nc.Close()
		return nil, nil, producer.NewLocalError(errors.New("nats producer is closed"))
	}
	p.nc, p.js = nc, js
	p.maxPayload.Store(nc.MaxPayload())
	return nc, js, nil
}

// Batches cuts msgs into batches of at most MaxBatch messages. A topic that is
// not a valid subject fails the whole topic (topic class, no batches). Rows
// that can never be published (see toMsg), or larger than the server's
// max_payload, are left out and named in a message-class error, each with its
// reason.
//
// Cutting neither needs nor opens a connection: without one it uses the
// max_payload the server last said, or before any server answered checks no
// size at all (the client refuses a message over the limit at the send, which
// pins it on that row); and the send, which connects, fails instead. A failed
// cut would count an attempt on every row without the broker breaker ever
// seeing a failed send, and so dead-letter the outbox while the server is down.
func (p *Producer) Batches(ctx context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	p.mu.Lock()
	closed, nc, js := p.closed, p.nc, p.js
	p.mu.Unlock()
	if closed {
		return nil, producer.NewLocalError(errors.New("nats producer is closed"))
	}
	if err := checkSubject(topic); err != nil {
		return nil, err
	}
	if nc != nil && nc.IsConnected() {
		if err := p.streams.check(ctx, js, topic); err != nil {
			return nil, err
		}
	}
	limit := p.maxPayload.Load() // 0 before any server answered: no check
	if nc != nil && nc.IsConnected() {
		limit = nc.MaxPayload()
	}
	var rej producer.Rejections
	valid := rej.Keep(msgs, func(m *producer.Message) (string, error) {
		msg, reason, err := toMsg(m)
		if err != nil {
			return reason, err
		}
		m.Prepared = msg // Send takes it as it is
		if n := sizeOf(m); limit > 0 && int64(n) > limit {
			return producer.ReasonMessageTooLarge, fmt.Errorf(
				"row %d: message of about %d bytes is over the NATS server's max_payload of %d", m.ID, n, limit)
		}
		return "", nil
	})
	out, _, _ := producer.Split(topic, valid, producer.Limits{Messages: p.cfg.MaxBatch})
	return out, rej.Err()
}

// CheckTopic refuses, as topic class, a subject that is not a valid literal
// subject, or that no stream captures as far as the stream list says (see
// streams.go). While not connected it cannot tell, and says nil: it never
// connects.
func (p *Producer) CheckTopic(ctx context.Context, topic string) error {
	if err := checkSubject(topic); err != nil {
		return err
	}
	p.mu.Lock()
	nc, js := p.nc, p.js
	p.mu.Unlock()
	if nc == nil || !nc.IsConnected() {
		return nil
	}
	return p.streams.check(ctx, js, topic)
}

// sizeOf is about a message's size as max_payload counts it: the payload and
// the header block, whose size this overestimates a little.
func sizeOf(m *producer.Message) int {
	return len(m.Payload) + len(m.Headers) + len(m.MessageID) + len(m.ContentType) + len(m.CorrelationID) + len(m.PartitionKey) + 96
}

// Send publishes the batch asynchronously and waits for every ack. It checks
// the subject and the rows again, as Batches does: a Send may get any batch,
// and a row that slipped through must fail alone, never on the shared
// connection. A row it refuses makes it send nothing, and names that row.
func (p *Producer) Send(ctx context.Context, b producer.Batch) error {
	if err := checkSubject(b.Topic); err != nil {
		return err
	}
	msgs := make([]*natsgo.Msg, len(b.Messages))
	var rej producer.Rejections
	for i := range b.Messages {
		m, reason, err := toMsg(&b.Messages[i])
		if err != nil {
			rej.Add(b.Messages[i].ID, reason, err)
			continue
		}
		m.Subject = b.Topic
		msgs[i] = m
	}
	if err := rej.Err(); err != nil {
		return err
	}

	nc, js, err := p.conn(ctx)
	if err != nil {
		return err
	}
	if nc.IsConnected() { // while reconnecting, the list cannot be read
		if err := p.streams.check(ctx, js, b.Topic); err != nil {
			return err
		}
	}
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		f, err := js.PublishMsgAsync(m, jetstream.WithMsgID(b.Messages[i].MessageID))
		if err != nil {
			return producer.PinOn(classify(fmt.Errorf("publish to subject %q: %w", b.Topic, err)), b.Messages[i].ID)
		}
		futures[i] = f
	}

	// Wait for every ack, even after a message's failure: the batch's outcome
	// is the worst of its messages. A topic failure is the one that says most
	// and ends the wait at once: the messages after it would each wait out
	// the client's retries against a stream that is gone. Acks are per
	// message, so a failure names the messages the stream took before it
	// (producer.Delivered): the sweeper sends those no more. One it took
	// after, unnamed, is sent again, and JetStream drops the copy by its
	// Nats-Msg-Id within the stream's duplicate window
	// (TestAcksAfterATopicFailureAreNotClaimedAndTheirResendIsDropped).
	var worst error
	var rejected, acked []int64
	for i, f := range futures {
		select {
		case <-f.Ok():
			acked = append(acked, b.Messages[i].ID)
		case err := <-f.Err():
			err = classify(fmt.Errorf("publish to subject %q: %w", b.Topic, err))
			switch producer.ClassOf(err) {
			case producer.ClassMessage:
				rejected = append(rejected, b.Messages[i].ID)
				if worst == nil {
					worst = err
				}
			case producer.ClassTopic:
				return producer.WithDelivered(err, acked)
			default:
				worst = err
			}
		case <-ctx.Done():
			return producer.WithDelivered(fmt.Errorf("waiting for %d JetStream acks on %q: %w", len(futures), b.Topic, ctx.Err()), acked)
		case <-p.done:
			return producer.WithDelivered(producer.NewLocalError(fmt.Errorf("nats producer closed while %d JetStream acks on %q were awaited", len(futures), b.Topic)), acked)
		}
	}
	if worst != nil && producer.ClassOf(worst) == producer.ClassMessage {
		worst = producer.NewMessageError(producer.ReasonOf(worst), rejected, worst)
	}
	return producer.WithDelivered(worst, acked)
}

// Check tells whether the server answers: it connects if needed, then makes a
// round trip to the server (a flush: PING, PONG) and one to JetStream (account
// info), neither of which publishes anything. It returns by ctx's end; a ctx
// without a deadline is bounded by ConnectTimeout.
func (p *Producer) Check(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.ConnectTimeout)
		defer cancel()
	}
	nc, js, err := p.conn(ctx)
	if err != nil {
		return err
	}
	if !nc.IsConnected() {
		// Reconnecting: a flush would only wait for the deadline.
		return producer.NewBrokerError("connection_lost", fmt.Errorf("check NATS: not connected (%s)", nc.Status()))
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		return checkFailed(ctx, fmt.Errorf("check NATS: flush: %w", err))
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		return checkFailed(ctx, fmt.Errorf("check NATS: JetStream account info: %w", err))
	}
	return nil
}

// checkFailed classifies a failed check: no answer within the deadline is
// the broker's failure, like a lost connection.
func checkFailed(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, natsgo.ErrTimeout) {
		return producer.NewBrokerError("no_answer", err)
	}
	return classify(err)
}

// Close drains nothing and closes the connection: a send still waiting for
// its acks ends at once with a local error (its rows stay outstanding), and
// sends after it fail with one.
func (p *Producer) Close(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		close(p.done)
	}
	p.closed = true
	if p.nc != nil {
		p.nc.Close()
	}
	return nil
}

// JetStream's error codes (nats-server's errors.json) that nats.go names not:
// a stream's store refusing a message past its limits ("maximum messages
// exceeded", "maximum bytes exceeded", "maximum messages per subject
// exceeded"), and an account or server out of JetStream resources.
const (
	errCodeAccountResourcesExceeded jetstream.ErrorCode = 10002
	errCodeInsufficientResources    jetstream.ErrorCode = 10023
	errCodeStreamStoreFailed        jetstream.ErrorCode = 10077
)

// classify maps NATS errors onto the failure classes.
func classify(err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, natsgo.ErrNoResponders):
		return producer.NewTopicError("no_stream", fmt.Errorf("%w (create a stream whose subjects include this one)", err))
	case errors.Is(err, natsgo.ErrMaxPayload):
		return producer.NewMessageError(producer.ReasonMessageTooLarge, nil, err)
	case errors.Is(err, natsgo.ErrPermissionViolation), errors.Is(err, natsgo.ErrAuthorization):
		return producer.NewTopicError("unauthorized", err)
	case errors.As(err, &apiErr):
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamMessageExceedsMaximum:
			return producer.NewMessageError(producer.ReasonMessageTooLarge, nil, err)
		case jetstream.JSErrCodeJetStreamNotEnabled, jetstream.JSErrCodeJetStreamNotEnabledForAccount:
			return producer.NewTopicError("jetstream_disabled", err)
		case errCodeStreamStoreFailed, errCodeAccountResourcesExceeded, errCodeInsufficientResources:
			// A stream at a limit with discard new (maximum messages, bytes,
			// messages per subject) refuses every message until it is consumed.
			// As a transient failure, the head row counted an attempt at each
			// try, and valid messages were dead-lettered one after another
			// (an independent review, 2026-11-29).
			return producer.NewTopicError("stream_full", fmt.Errorf(
				"%w (the stream, or the account's JetStream, is at a limit and refuses new messages: consume or purge it, or raise its limits)", err))
		}
		return producer.NewTransientError("jetstream_error", err)
	case errors.Is(err, natsgo.ErrConnectionClosed), errors.Is(err, natsgo.ErrDisconnected),
		errors.Is(err, natsgo.ErrConnectionReconnecting), errors.Is(err, natsgo.ErrNoServers),
		errors.Is(err, natsgo.ErrReconnectBufExceeded):
		// The server is not reached, whatever the rows hold.
		return producer.NewBrokerError("connection_lost", err)
	}
	return err
}

// redactURLs returns the comma-separated server URLs with their passwords and
// tokens hidden: errors reach logs and rows' last_error.
func redactURLs(list string) string {
	parts := strings.Split(list, ",")
	for i, raw := range parts {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil {
			parts[i] = "(unparsable URL)"
			continue
		}
		if u.User != nil {
			if _, hasPassword := u.User.Password(); hasPassword {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			} else {
				u.User = url.User("xxxxx") // a token alone
			}
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// MessagingSystem names the broker in the sweeper's spans (messaging.system).
func (p *Producer) MessagingSystem() string { return "nats" }
