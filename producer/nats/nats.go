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
// Failure classes: a subject no stream captures ("no response from stream") is
// topic-class; a message over the server's max_payload or the stream's
// max_msg_size is message-class; a lost connection, a timeout or a stream that is
// full is transient.
package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
}

// Producer publishes to JetStream. It is safe for concurrent use.
type Producer struct {
	cfg Config

	dialMu sync.Mutex // one connect at a time, outside mu so Close never waits for it
	mu     sync.Mutex
	nc     *natsgo.Conn
	js     jetstream.JetStream
	closed bool
	// maxPayload is the server's max_payload as last seen, for cutting batches
	// while not connected.
	maxPayload atomic.Int64
}

var _ producer.Producer = (*Producer)(nil)

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
	return &Producer{cfg: cfg}, nil
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
	p.dialMu.Lock()
	defer p.dialMu.Unlock()
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
		return nil, nil, producer.NewTransientError("connection_lost", fmt.Errorf("connect to NATS at %s: no time left before the send's deadline", p.cfg.URL))
	}
	nc, err := natsgo.Connect(p.cfg.URL,
		natsgo.Name("outbox-sweeper"),
		natsgo.Timeout(timeout),
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(500*time.Millisecond),
	)
	if err != nil {
		return nil, nil, producer.NewTransientError("connection_lost", fmt.Errorf("connect to NATS at %s: %w", p.cfg.URL, err))
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

// Batches cuts msgs into batches of at most MaxBatch messages. Messages larger
// than the server's max_payload are left out and named in a message-class error.
//
// Cutting neither needs nor opens a connection: without one it uses the
// max_payload the server last said, or before any server answered checks no
// size at all (the client refuses a message over the limit at the send, which
// pins it on that row); and the send, which connects, fails instead. A failed cut would count an attempt on every
// row without the broker breaker ever seeing a failed send, and so dead-letter
// the outbox while the server is down.
func (p *Producer) Batches(_ context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	p.mu.Lock()
	closed, nc := p.closed, p.nc
	p.mu.Unlock()
	if closed {
		return nil, producer.NewLocalError(errors.New("nats producer is closed"))
	}
	limit := p.maxPayload.Load() // 0 before any server answered: no check
	if nc != nil && nc.IsConnected() {
		limit = nc.MaxPayload()
	}
	out, tooBig, maxSeen := producer.Split(topic, msgs, producer.Limits{
		Messages:     p.cfg.MaxBatch,
		MessageBytes: int(max(limit, 0)), // 0 (unknown): no limit
		// Headers count against max_payload too; this is their size as sent.
		Size: func(m *producer.Message) int {
			return len(m.Payload) + len(m.Headers) + len(m.MessageID) + len(m.ContentType) + len(m.CorrelationID) + len(m.PartitionKey) + 96
		},
	})
	if len(tooBig) > 0 {
		return out, producer.NewMessageError(producer.ReasonMessageTooLarge, tooBig,
			fmt.Errorf("message of about %d bytes is over the NATS server's max_payload of %d", maxSeen, limit))
	}
	return out, nil
}

// Send publishes the batch asynchronously and waits for every ack.
func (p *Producer) Send(ctx context.Context, b producer.Batch) error {
	msgs := make([]*natsgo.Msg, len(b.Messages))
	var invalid []int64
	var firstErr error
	for i := range b.Messages {
		m, err := toMsg(&b.Messages[i])
		if err != nil {
			invalid = append(invalid, b.Messages[i].ID)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		msgs[i] = m
	}
	if len(invalid) > 0 {
		return producer.NewMessageError(producer.ReasonInvalidMessage, invalid, firstErr)
	}

	_, js, err := p.conn(ctx)
	if err != nil {
		return err
	}
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		f, err := js.PublishMsgAsync(m, jetstream.WithMsgID(b.Messages[i].MessageID))
		if err != nil {
			return producer.PinOn(classify(fmt.Errorf("publish to subject %q: %w", b.Topic, err)), b.Messages[i].ID)
		}
		futures[i] = f
	}

	// Wait for every ack, even after a failure: the batch's outcome is the worst
	// of its messages, and a topic failure is the one that says most.
	var worst error
	var rejected []int64
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			err = classify(fmt.Errorf("publish to subject %q: %w", b.Topic, err))
			switch producer.ClassOf(err) {
			case producer.ClassMessage:
				rejected = append(rejected, b.Messages[i].ID)
				if worst == nil {
					worst = err
				}
			case producer.ClassTopic:
				return err
			default:
				worst = err
			}
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d JetStream acks on %q: %w", len(futures), b.Topic, ctx.Err())
		}
	}
	if worst != nil && producer.ClassOf(worst) == producer.ClassMessage {
		return producer.NewMessageError(producer.ReasonOf(worst), rejected, worst)
	}
	return worst
}

// Close drains nothing (every Send has awaited its acks) and closes the
// connection; sends after it fail with a local error.
func (p *Producer) Close(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.nc != nil {
		p.nc.Close()
	}
	return nil
}

// toMsg maps a message onto a NATS message.
func toMsg(m *producer.Message) (*natsgo.Msg, error) {
	headers, err := m.DecodeHeaders()
	if err != nil {
		return nil, err
	}
	msg := natsgo.NewMsg(m.Topic)
	msg.Data = m.Payload
	for k, v := range headers {
		if k == "" {
			return nil, fmt.Errorf("row %d has a header with an empty name", m.ID)
		}
		if len(k) >= 5 && strings.EqualFold(k[:5], "nats-") {
			// Nats-* headers steer JetStream itself (expected sequences,
			// rollups that purge a stream, TTLs): never from a row.
			return nil, fmt.Errorf("row %d has header %q: Nats-* headers are reserved for the server", m.ID, k)
		}
		if s, ok := v.(string); ok {
			msg.Header.Set(k, s)
			continue
		}
		j, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("header %q of row %d: %w", k, m.ID, err)
		}
		msg.Header.Set(k, string(j))
	}
	if m.ContentType != "" {
		msg.Header.Set(headerContentType, m.ContentType)
	}
	if m.CorrelationID != "" {
		msg.Header.Set(headerCorrelationID, m.CorrelationID)
	}
	if m.PartitionKey != "" {
		msg.Header.Set(headerPartitionKey, m.PartitionKey)
	}
	return msg, nil
}

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
		}
		return producer.NewTransientError("jetstream_error", err)
	case errors.Is(err, natsgo.ErrConnectionClosed), errors.Is(err, natsgo.ErrDisconnected),
		errors.Is(err, natsgo.ErrConnectionReconnecting), errors.Is(err, natsgo.ErrNoServers):
		return producer.NewTransientError("connection_lost", err)
	}
	return err
}
