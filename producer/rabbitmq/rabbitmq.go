// Package rabbitmq is a producer that publishes outbox messages to a RabbitMQ
// exchange, with publisher confirms for every batch.
//
// The topic is the routing key. Every message is persistent and published with
// the mandatory flag, so a message no queue is bound for comes back (basic.return)
// instead of vanishing; RabbitMQ acknowledges returned messages too, so the
// producer matches returns to the batch by message id and reports them as a
// topic-class failure ("unroutable"). A nack or a timeout is transient; a
// connection that cannot be opened, or is lost, is a broker-class failure
// ("connection_lost"), which never counts against the rows. A closed channel
// or connection is opened again on the next send.
//
// Batches checks every row against AMQP's limits before anything is sent (see
// validate.go): a routing key over 255 bytes fails the topic; a message id,
// correlation id, content type or header key over 255 bytes, or headers too
// large for one frame, fail the row alone. Such rows would otherwise fail on
// the shared connection, or close it.
//
// Mapping: message_id → MessageId, correlation_id → CorrelationId, content_type →
// ContentType, headers → the AMQP headers table, created_at → Timestamp, and the
// partition key, when set, to the "partition_key" header.
package rabbitmq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-sweeper/sweeper/producer"
)

// Defaults for [Config].
const (
	ExchangeDefault        = "outbox"
	MaxBatchDefault        = 500
	MaxBatchBytesDefault   = 4 << 20
	MaxMessageBytesDefault = 128 << 20 // RabbitMQ's own default max_message_size
	DialTimeoutDefault     = 10 * time.Second
)

// Config configures a [Producer].
type Config struct {
	// URL is the AMQP URL, e.g. amqp://guest:guest@127.0.0.1:5672/. Required.
	URL string
	// Exchange is the durable topic exchange messages are published to; the
	// producer declares it. Defaults to ExchangeDefault.
	Exchange string
	// MaxBatch is the most messages in one batch. Defaults to MaxBatchDefault.
	MaxBatch int
	// MaxBatchBytes bounds the payload bytes of one batch, so a batch of large
	// messages does not hold the broker's confirms for long. Defaults to
	// MaxBatchBytesDefault.
	MaxBatchBytes int
	// MaxMessageBytes is the largest payload the broker accepts (its
	// max_message_size); a larger message is rejected as message-class before
	// any send. Defaults to MaxMessageBytesDefault.
	MaxMessageBytes int
	// DialTimeout bounds connecting. Defaults to DialTimeoutDefault.
	DialTimeout time.Duration
	// ConnectionName is shown in RabbitMQ's management UI and rabbitmqctl
	// list_connections. Defaults to "outbox-sweeper".
	ConnectionName string
}

func (c Config) withDefaults() Config {
	if c.Exchange == "" {
		c.Exchange = ExchangeDefault
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = MaxBatchDefault
	}
	if c.MaxBatchBytes <= 0 {
		c.MaxBatchBytes = MaxBatchBytesDefault
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = MaxMessageBytesDefault
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DialTimeoutDefault
	}
	if c.ConnectionName == "" {
		c.ConnectionName = "outbox-sweeper"
	}
	return c
}

// Producer publishes to RabbitMQ. It keeps one connection and a channel per
// concurrent send (channels are not safe for concurrent publishing with
// confirms). It is safe for concurrent use.
type Producer struct {
	cfg Config

	dial chan struct{} // one dial at a time: a slot, so waiting for it heeds ctx

	mu     sync.Mutex
	conn   *amqp.Connection
	cork   *corkConn     // conn's socket
	idle   []*pubChannel // channels not in use
	closed bool

	afterPublish func() // tests: runs between the last publish and the confirms
}

var (
	_ producer.Producer = (*Producer)(nil)
	_ producer.Checker  = (*Producer)(nil)
)

// New returns a producer; it does not connect until [Producer.Connect] or the
// first send, so a broker that is down at start is waited for, not fatal.
func New(cfg Config) (*Producer, error) {
	if cfg.URL == "" {
		return nil, errors.New("rabbitmq: no URL (--rabbitmq-url)")
	}
	if _, err := amqp.ParseURI(cfg.URL); err != nil {
		return nil, fmt.Errorf("rabbitmq: invalid URL (--rabbitmq-url): %w", err)
	}
	if len(cfg.Exchange) > shortStringMax {
		return nil, fmt.Errorf("rabbitmq: exchange name of %d bytes is over AMQP's short-string limit of %d bytes (--rabbitmq-exchange)",
			len(cfg.Exchange), shortStringMax)
	}
	return &Producer{cfg: cfg.withDefaults(), dial: make(chan struct{}, 1)}, nil
}

// Connect connects and declares the exchange, so that a start-up can report a
// broker it cannot reach. Sends connect by themselves when needed.
func (p *Producer) Connect(ctx context.Context) error {
	ch, err := p.take(ctx)
	if err != nil {
		return err
	}
	p.give(ch)
	return nil
}

// pubChannel is a channel in confirm mode with its notifications.
type pubChannel struct {
	ch      *amqp.Channel
	cork    *corkConn
	returns chan amqp.Return
	closed  chan *amqp.Error
}

// take returns an idle channel, or opens one (and the connection, if needed).
// The network calls run outside p.mu, so a slow broker holds up only the sends
// that need a new channel, not those with one.
func (p *Producer) take(ctx context.Context) (*pubChannel, error) {
	conn, cork, err := p.connection(ctx)
	if err != nil {
		return nil, err
	}
	if c := p.idleChannel(); c != nil {
		return c, nil
	}
	// amqp091 takes no context for opening a channel: a broker that stops
	// reading a publishing connection (a memory or disk alarm blocks it)
	// never answers, and the send waited past --send-timeout, holding its
	// sweep, until heartbeats gave up (an independent review, 2026-11-29). The
	// calls run aside; past ctx the send fails, and the channel, if it comes,
	// is closed.
	type opened struct {
		c   *pubChannel
		err error
	}
	done := make(chan opened, 1)
	go func() {
		c, err := p.open(conn, cork)
		done <- opened{c, err}
	}()
	select {
	case o := <-done:
		return o.c, o.err
	case <-ctx.Done():
		go func() {
			if o := <-done; o.c != nil {
				_ = o.c.ch.Close()
			}
		}()
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, ctx.Err()
		}
		return nil, producer.NewBrokerError("no_answer", fmt.Errorf(
			"open a RabbitMQ channel: no answer before the deadline (a blocked connection: is a memory or disk alarm raised?): %w", ctx.Err()))
	}
}

// open opens a channel on conn, declares the exchange and puts the channel in
// confirm mode.
func (p *Producer) open(conn *amqp.Connection, cork *corkConn) (*pubChannel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, classify(fmt.Errorf("open a RabbitMQ channel: %w", err))
	}
	if err := ch.ExchangeDeclare(p.cfg.Exchange, "topic", true, false, false, false, nil); err != nil {
		go ch.Close()
		return nil, exchangeRefused(p.cfg.Exchange, err)
	}
	if err := ch.Confirm(false); err != nil {
		go ch.Close()
		return nil, classify(fmt.Errorf("put channel in confirm mode: %w", err))
	}
	return &pubChannel{
		ch:   ch,
		cork: cork,
		// Returns arrive before the acks of their messages. The buffer holds a
		// whole batch's, so the connection's reader never waits on us.
		returns: ch.NotifyReturn(make(chan amqp.Return, p.cfg.MaxBatch)),
		closed:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

// exchangeRefused classifies a failed declare of the exchange. Every topic
// publishes through it, so the broker's refusal (the exchange exists with
// another type or other arguments, 406; no configure permission, 403) is the
// broker's failure for all of them: as a transient one, with the broker's
// check passing, batches were split and valid rows charged until they were
// dead-lettered; as a topic's, each topic tripped in turn (an independent
// review, 2026-11-29).
func exchangeRefused(exchange string, err error) error {
	err = classify(fmt.Errorf("declare exchange %q: %w", exchange, err))
	if c := producer.ClassOf(err); c == producer.ClassBroker || c == producer.ClassLocal {
		return err
	}
	return producer.NewBrokerError("exchange_refused", fmt.Errorf(
		"%w (every topic publishes through it: make it a durable topic exchange and grant configure on it, or publish through another)", err))
}

func (p *Producer) idleChannel() *pubChannel {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.idle) > 0 {
		c := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if !c.ch.IsClosed() {
			return c
		}
	}
	return nil
}

// connection returns the open connection, dialling one if needed; one dial at a
// time (p.dial), bounded by DialTimeout. Waiting for another caller's dial
// ends with ctx, so a health check never outlives its deadline behind a send
// that dials a broker that does not answer.
func (p *Producer) connection(ctx context.Context) (*amqp.Connection, *corkConn, error) {
	select {
	case p.dial <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("wait for the connection to RabbitMQ: %w", ctx.Err())
	}
	defer func() { <-p.dial }()
	p.mu.Lock()
	closed, conn, cork := p.closed, p.conn, p.cork
	p.mu.Unlock()
	if closed {
		return nil, nil, producer.NewLocalError(errors.New("rabbitmq producer is closed"))
	}
	if conn != nil && !conn.IsClosed() {
		return conn, cork, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	// The dial and the AMQP handshake end by DialTimeout, or by the send's own
	// deadline if sooner: a broker that accepts and then says nothing must not
	// hold a send past --send-timeout.
	deadline := time.Now().Add(p.cfg.DialTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	conn, err := amqp.DialConfig(p.cfg.URL, amqp.Config{
		Dial: func(network, addr string) (net.Conn, error) {
			// One deadline for the TCP dial and the AMQP handshake together;
			// the client clears it once the connection is open.
			c, err := (&net.Dialer{Deadline: deadline}).Dial(network, addr)
			if err != nil {
				return nil, err
			}
			if err := c.SetDeadline(deadline); err != nil {
				_ = c.Close()
				return nil, err
			}
			cork = newCorkConn(c)
			return cork, nil
		},
		Properties: amqp.Table{"connection_name": p.cfg.ConnectionName},
	})
	if err != nil {
		// Refused, reset, timed out in the handshake, or turned away (bad
		// credentials, no such vhost): whatever the reason, no row was sent
		// and none is to blame.
		return nil, nil, producer.NewBrokerError("connection_lost", fmt.Errorf("connect to RabbitMQ: %w", err))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		go conn.Close()
		return nil, nil, producer.NewLocalError(errors.New("rabbitmq producer is closed"))
	}
	p.conn, p.cork, p.idle = conn, cork, nil
	return conn, cork, nil
}

// give puts a healthy channel back for the next send.
func (p *Producer) give(c *pubChannel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || c.ch.IsClosed() {
		go c.ch.Close()
		return
	}
	p.idle = append(p.idle, c)
}

// Batches cuts msgs into batches of at most MaxBatch messages and MaxBatchBytes
// payload bytes. It needs no connection. A topic too long for a routing key
// fails the whole topic (topic class, no batches). Rows that can never be
// published (over MaxMessageBytes, or over an AMQP limit: see publishing) are
// left out and named in a message-class error, each with its reason.
func (p *Producer) Batches(_ context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	if err := checkRoutingKey(topic); err != nil {
		return nil, err
	}
	frameMax := p.frameMax()
	var rej producer.Rejections
	valid := rej.Keep(msgs, func(m *producer.Message) (string, error) {
		pre, reason, err := publishing(m, p.cfg.MaxMessageBytes, frameMax)
		if err != nil {
			return reason, err
		}
		m.Prepared = pre // Send takes it from there
		return "", nil
	})
	out, _, _ := producer.Split(topic, valid, producer.Limits{Messages: p.cfg.MaxBatch, Bytes: p.cfg.MaxBatchBytes})
	return out, rej.Err()
}

// Send publishes the batch and waits for every confirm. It checks the rows
// again, as Batches does: a Send may get any batch, and a row that slipped
// through must fail alone, never on the shared connection. A row it refuses
// makes it send nothing, and names that row.
func (p *Producer) Send(ctx context.Context, b producer.Batch) error {
	if err := checkRoutingKey(b.Topic); err != nil {
		return err
	}
	frameMax := p.frameMax()
	pubs, err := p.publishings(b, frameMax)
	if err != nil {
		return err
	}

	c, err := p.take(ctx)
	if err != nil {
		return err
	}
	if fm := p.frameMax(); fm < frameMax {
		// take connected anew, and the broker allows smaller frames than the
		// rows were checked against.
		if _, err := p.publishings(b, fm); err != nil {
			p.give(c)
			return err
		}
	}
	// RabbitMQ closes the whole channel for content too large.
	err = producer.PinOnLargest(p.publish(ctx, c, b, pubs), b)
	if err != nil && producer.ClassOf(err) != producer.ClassTopic {
		// The channel's state is unknown (confirms or returns may still come):
		// never reuse it. Closing waits for the broker, so not here.
		go c.ch.Close()
		return err
	}
	p.give(c)
	return err
}

// publishings maps the batch's messages, or names every row that can never be
// published.
func (p *Producer) publishings(b producer.Batch, frameMax int) ([]amqp.Publishing, error) {
	pubs := make([]amqp.Publishing, len(b.Messages))
	var rej producer.Rejections
	now := time.Now()
	for i := range b.Messages {
		pre, reason, err := publishing(&b.Messages[i], p.cfg.MaxMessageBytes, frameMax)
		if err != nil {
			rej.Add(b.Messages[i].ID, reason, err)
			continue
		}
		pub := pre.pub
		// The row's deadline travels as the time left (RabbitMQ drops the
		// message from its queues once it passes).
		pub.Expiration = expiration(b.Messages[i].ExpiresAt, now)
		pubs[i] = pub
	}
	return pubs, rej.Err()
}

func (p *Producer) publish(ctx context.Context, c *pubChannel, b producer.Batch, pubs []amqp.Publishing) error {
	confirms := make([]*amqp.DeferredConfirmation, len(pubs))
	// The client flushes the socket after every message; corked, the batch goes
	// out in a few large writes, which costs RabbitMQ (and us) far less CPU per
	// message (about a quarter more throughput with confirms, measured here).
	deadline, _ := ctx.Deadline()
	c.cork.cork(deadline)
	for i := range pubs {
		dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, b.Topic, true, false, pubs[i])
		if err != nil {
			c.cork.uncork()
			return classify(fmt.Errorf("publish to exchange %q with routing key %q: %w", p.cfg.Exchange, b.Topic, err))
		}
		confirms[i] = dc
	}
	if err := c.cork.uncork(); err != nil {
		return classify(fmt.Errorf("publish %d messages to exchange %q with routing key %q: %w", len(pubs), p.cfg.Exchange, b.Topic, err))
	}
	if p.afterPublish != nil {
		p.afterPublish()
	}

	// Confirms are per message: a failure names the messages the broker
	// confirmed and routed before it (producer.Delivered), which the
	// sweeper sends no more.
	returned := map[string]amqp.Return{}
	nacked := 0
	var acked []int // indexes in b
	took := func(err error) error {
		var d []int64
		for _, i := range acked {
			if _, ok := returned[b.Messages[i].MessageID]; !ok {
				d = append(d, b.Messages[i].ID)
			}
		}
		return producer.WithDelivered(err, d)
	}
	for i, dc := range confirms {
	wait:
		for {
			select {
			case r, ok := <-c.returns:
				if !ok {
					return took(errChannelGone(c, b, len(pubs)))
				}
				returned[r.MessageId] = r
			case <-dc.Done():
				if dc.Acked() {
					acked = append(acked, i)
				} else {
					nacked++
				}
				break wait
			case e := <-c.closed:
				if e == nil {
					e = &amqp.Error{Code: amqp.ChannelError, Reason: "channel closed"}
				}
				return took(classify(fmt.Errorf("channel closed while waiting for confirms of %d messages to %q: %w", len(pubs), b.Topic, e)))
			case <-ctx.Done():
				return took(fmt.Errorf("waiting for confirms of %d messages to %q: %w", len(pubs), b.Topic, ctx.Err()))
			}
		}
	}
	// A return precedes its message's ack, so every return of the batch is in
	// the buffer by now.
	for {
		select {
		case r, ok := <-c.returns:
			if !ok {
				// The channel shut down (amqp091 closes the returns channel):
				// nacks that came from the shutdown say nothing about routing.
				return took(errChannelGone(c, b, len(pubs)))
			}
			returned[r.MessageId] = r
			continue
		default:
		}
		break
	}

	if len(returned) > 0 {
		var r amqp.Return
		for _, x := range returned {
			r = x
			break
		}
		return took(producer.NewTopicError("unroutable", fmt.Errorf(
			"%d of %d messages returned by exchange %q for routing key %q: %d %s (bind a queue to that routing key)",
			len(returned), len(pubs), p.cfg.Exchange, b.Topic, r.ReplyCode, r.ReplyText)))
	}
	if nacked > 0 {
		// Topic class: a queue bound to the topic that rejects publishes past
		// its length (x-overflow reject-publish) nacks every message until it
		// is consumed. As a transient failure, the head row counted an attempt
		// at each try, and valid messages were dead-lettered one after another
		// while a consumer was down (an independent review, 2026-11-29); as
		// the topic's, they wait, and /status says why.
		return took(producer.NewTopicError("nacked", fmt.Errorf(
			"RabbitMQ nacked %d of %d messages to %q: a queue bound to it is full and rejects publishes (x-overflow reject-publish), "+
				"or its process failed; consume or purge it, or raise its x-max-length", nacked, len(pubs), b.Topic)))
	}
	return nil
}

// errChannelGone reports a batch whose channel shut down before every confirm
// came: the broker may have some of the messages, so the batch is sent again.
// amqp091 tells the closing error before it closes the returns, so a channel
// the broker closed for a reason of its own (a message over its size limit)
// is classified by that reason; without one, the connection went.
func errChannelGone(c *pubChannel, b producer.Batch, n int) error {
	select {
	case e, ok := <-c.closed:
		if ok && e != nil {
			return classify(fmt.Errorf("channel closed while waiting for confirms of %d messages to %q: %w", n, b.Topic, e))
		}
	default:
	}
	return producer.NewBrokerError("connection_lost",
		fmt.Errorf("channel closed while waiting for confirms of %d messages to %q", n, b.Topic))
}

// Check tells whether RabbitMQ answers: it connects if needed, then declares
// the exchange passively on a channel of its own (a round trip that creates
// nothing and publishes nothing). amqp091's calls take no context, so they
// run in a goroutine and Check gives up at ctx's end, even against a broker
// that accepted the connection and then went silent; the goroutine closes its
// channel in the background once the broker answers or the connection dies
// (at the latest when heartbeats time out). A ctx without a deadline is
// bounded by DialTimeout.
func (p *Producer) Check(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.DialTimeout)
		defer cancel()
	}
	conn, _, err := p.connection(ctx)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		ch, err := conn.Channel()
		if err != nil {
			done <- classify(fmt.Errorf("check RabbitMQ: open a channel: %w", err))
			return
		}
		err = ch.ExchangeDeclarePassive(p.cfg.Exchange, "topic", true, false, false, false, nil)
		if err != nil {
			err = classify(fmt.Errorf("check RabbitMQ: passive declare of exchange %q: %w", p.cfg.Exchange, err))
		}
		done <- err
		_ = ch.Close() // waits for the broker; nobody waits for it
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.Canceled) {
			return ctx.Err()
		}
		return producer.NewBrokerError("no_answer", fmt.Errorf(
			"check RabbitMQ: no answer to a passive declare of exchange %q before the deadline: %w", p.cfg.Exchange, ctx.Err()))
	}
}

// Close closes the connection; sends after it fail with a local error.
func (p *Producer) Close(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.idle = nil
	if p.conn == nil || p.conn.IsClosed() {
		return nil
	}
	// A broker that hangs never answers the close handshake: bound it, so
	// that a shutdown does not wait for amqp091's own timeout. The socket is
	// closed either way, and the sends waiting for confirms end.
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(closeTimeout)
	}
	if err := p.conn.CloseDeadline(deadline); err != nil {
		return fmt.Errorf("close the AMQP connection (closed without the broker's answer): %w", err)
	}
	return nil
}

// closeTimeout bounds the close handshake when Close's context has no
// deadline.
const closeTimeout = 2 * time.Second

// toTable converts decoded JSON into AMQP field values: objects become nested
// tables, arrays stay arrays, whole numbers that fit become int64 (exactly, even
// past 2^53), other numbers float64.
func toTable(h map[string]any) map[string]any {
	if h == nil {
		return nil
	}
	out := make(amqp.Table, len(h))
	for k, v := range h {
		out[k] = toField(v)
	}
	return out
}

func toField(v any) any {
	switch x := v.(type) {
	case map[string]any:
		return amqp.Table(toTable(x))
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = toField(x[i])
		}
		return out
	case json.Number:
		return producer.HeaderNumber(x)
	default:
		return v
	}
}

// classify maps RabbitMQ's errors onto the failure classes.
//
//   - 403 access refused, 404 not found: the destination is wrong → topic.
//   - 311 content too large: a message → message-class, though RabbitMQ cannot
//     say which one (Batches rejects oversized messages before this happens).
//   - the connection or channel is not open, the client lost the socket (an
//     error amqp091 raised itself, such as 501 EOF), 320 connection forced (the
//     broker shutting down) → broker: the broker was not reached, whatever
//     the rows held.
//   - 506 resource error, 541 internal error, everything else: transient.
func classify(err error) error {
	if errors.Is(err, amqp.ErrClosed) {
		return producer.NewBrokerError("connection_lost", err)
	}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		if ae == amqp.ErrChannelMax {
			return producer.NewTransientError("channel_max", err)
		}
		if !ae.Server || ae.Code == amqp.ConnectionForced {
			return producer.NewBrokerError("connection_lost", err)
		}
		switch ae.Code {
		case amqp.AccessRefused:
			return producer.NewTopicError("unauthorized", err)
		case amqp.NotFound:
			return producer.NewTopicError("not_found", err)
		case amqp.ContentTooLarge:
			return producer.NewMessageError(producer.ReasonMessageTooLarge, nil, err)
		case amqp.PreconditionFailed:
			if strings.Contains(ae.Reason, "message size") {
				return producer.NewMessageError(producer.ReasonMessageTooLarge, nil, err)
			}
		}
	}
	return err
}

// MessagingSystem names the broker in the sweeper's spans (messaging.system).
func (p *Producer) MessagingSystem() string { return "rabbitmq" }
