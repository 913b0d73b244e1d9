// Package servicebus is a producer that sends outbox messages to Azure Service
// Bus queues and topics.
//
// The outbox topic is the entity (queue or topic) name. The producer keeps one
// sender per entity, created on first use and closed by Close. Batches are cut
// by the SDK's own size accounting (NewMessageBatch/AddMessage): a full batch
// starts the next, and a message too large for an empty batch is rejected as
// message-class; for entities that need it (partitioned, session-enabled),
// also by partition key (keys.go). Mapping: message_id → MessageID (so
// duplicate detection drops a redelivery), correlation_id → CorrelationID,
// content_type → ContentType, partition_key → SessionID and PartitionKey,
// headers → ApplicationProperties (strings, numbers
// and booleans as they are; nested objects and arrays as their JSON text, since
// application properties hold only simple values).
//
// Batches checks every row against Service Bus's documented property limits
// before anything is sent (see validate.go): an entity path over 260
// characters fails the topic; a message id or session id over 128 characters,
// a property over 32 KB or properties over the 64 KB header fail the row
// alone.
//
// The producer is no producer.Checker: the SDK has no call that reaches the
// service without sending or receiving (a sender's link opens once and is
// reused, so NewMessageBatch says nothing about the connection after that),
// and the management operations need rights a sender does not have.
//
// The SDK retries on its own, by default for most of a minute per send. The
// producer sets it to one quick retry (enough to re-attach a link Service Bus
// closed while idle), so that a failing send returns within a few seconds and the
// sweeper's own retry and breakers decide what happens next.
package servicebus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"

	"github.com/outbox-sweeper/sweeper/producer"
)

// Defaults for [Config].
const (
	MaxBatchDefault = 500
)

// RetryOptionsDefault are the SDK retry options the producer sets unless told
// otherwise: one retry after 250ms.
var RetryOptionsDefault = azservicebus.RetryOptions{MaxRetries: 1, RetryDelay: 250 * time.Millisecond, MaxRetryDelay: time.Second}

// Config configures a [Producer]. Exactly one of ConnectionString and Namespace
// is required.
type Config struct {
	// ConnectionString is a Service Bus connection string with send rights.
	ConnectionString string
	// Namespace is the fully qualified namespace, e.g.
	// my-namespace.servicebus.windows.net; the producer authenticates with
	// azidentity's default credential (environment, workload identity, managed
	// identity, Azure CLI).
	Namespace string
	// MaxBatch is the most messages in one batch, whatever their size. Defaults
	// to MaxBatchDefault.
	MaxBatch int
	// Retry overrides the SDK's retry options. Zero means RetryOptionsDefault.
	Retry azservicebus.RetryOptions
	// BatchByKey cuts every batch to one partition key (session id), as
	// partitioned and session-enabled entities require. Without it the
	// producer learns it per entity, from the first batch the service
	// refuses as mixed (see keys.go).
	BatchByKey bool
	// Logger receives what the producer learns of an entity, and
	// descriptions of refusals it does not know, once each. Defaults to
	// discarding.
	Logger *slog.Logger
}

// sender is the part of *azservicebus.Sender the producer uses. The tests
// implement it to check batching and error mapping without a namespace.
type sender interface {
	NewMessageBatch(ctx context.Context) (messageBatch, error)
	SendMessageBatch(ctx context.Context, b messageBatch) error
	Close(ctx context.Context) error
}

// messageBatch is the part of *azservicebus.MessageBatch the producer uses.
type messageBatch interface {
	AddMessage(m *azservicebus.Message, options *azservicebus.AddMessageOptions) error
	NumMessages() int32
}

var _ messageBatch = (*azservicebus.MessageBatch)(nil)

// sdkSender adapts *azservicebus.Sender to sender.
type sdkSender struct{ s *azservicebus.Sender }

func (a sdkSender) NewMessageBatch(ctx context.Context) (messageBatch, error) {
	return a.s.NewMessageBatch(ctx, nil)
}

func (a sdkSender) SendMessageBatch(ctx context.Context, b messageBatch) error {
	return a.s.SendMessageBatch(ctx, b.(*azservicebus.MessageBatch), nil)
}

func (a sdkSender) Close(ctx context.Context) error { return a.s.Close(ctx) }

// Producer sends to Service Bus. It is safe for concurrent use.
type Producer struct {
	maxBatch    int
	batchByKey  bool
	logger      *slog.Logger
	newSender   func(entity string) (sender, error)
	closeClient func(ctx context.Context) error

	mu       sync.Mutex
	senders  map[string]sender
	entities map[string]entity
	unknown  map[string]bool // not-allowed descriptions already logged
	closed   bool
}

var _ producer.Producer = (*Producer)(nil)

// New returns a producer. It creates the SDK client, which connects lazily.
func New(cfg Config) (*Producer, error) {
	opts := &azservicebus.ClientOptions{RetryOptions: cfg.Retry}
	if opts.RetryOptions == (azservicebus.RetryOptions{}) {
		opts.RetryOptions = RetryOptionsDefault
	}
	var (
		client *azservicebus.Client
		err    error
	)
	switch {
	case cfg.ConnectionString != "" && cfg.Namespace != "":
		return nil, errors.New("servicebus: both --servicebus-connection-string and --servicebus-namespace are set: use one")
	case cfg.ConnectionString != "":
		client, err = azservicebus.NewClientFromConnectionString(cfg.ConnectionString, opts)
		if err != nil {
			return nil, fmt.Errorf("servicebus: invalid connection string (--servicebus-connection-string): %w", err)
		}
	case cfg.Namespace != "":
		cred, err := azidentity.NewDefaultAzureCredential(nil)
		if err != nil {
			return nil, fmt.Errorf("servicebus: no Azure credential for namespace %q: %w", cfg.Namespace, err)
		}
		client, err = azservicebus.NewClient(cfg.Namespace, cred, opts)
		if err != nil {
			return nil, fmt.Errorf("servicebus: namespace %q (--servicebus-namespace): %w", cfg.Namespace, err)
		}
	default:
		return nil, errors.New("servicebus: set --servicebus-connection-string or --servicebus-namespace")
	}
	p := newProducer(cfg, func(entity string) (sender, error) {
		s, err := client.NewSender(entity, nil)
		if err != nil {
			return nil, err
		}
		return sdkSender{s}, nil
	})
	p.closeClient = client.Close
	return p, nil
}

func newProducer(cfg Config, newSender func(string) (sender, error)) *Producer {
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = MaxBatchDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Producer{
		maxBatch:    cfg.MaxBatch,
		batchByKey:  cfg.BatchByKey,
		logger:      cfg.Logger,
		newSender:   newSender,
		closeClient: func(context.Context) error { return nil },
		senders:     make(map[string]sender),
		entities:    make(map[string]entity),
		unknown:     make(map[string]bool),
	}
}

// sender returns entity's cached sender, creating it on first use.
func (p *Producer) sender(entity string) (sender, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, producer.NewLocalError(errors.New("servicebus producer is closed"))
	}
	if s, ok := p.senders[entity]; ok {
		return s, nil
	}
	s, err := p.newSender(entity)
	if err != nil {
		return nil, classify(fmt.Errorf("create sender for %q: %w", entity, err))
	}
	p.senders[entity] = s
	return s, nil
}

// forget drops entity's sender after an error that closed it, so the next send
// creates a new one.
func (p *Producer) forget(ctx context.Context, entity string, s sender) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.senders[entity] == s {
		delete(p.senders, entity)
		// Closing talks to the service: not under the lock every topic needs.
		go func() { _ = s.Close(ctx) }()
	}
}

// Batches cuts msgs where the SDK says a batch is full, or at MaxBatch
// messages; for an entity that needs it (Config.BatchByKey, or learnt from a
// refusal), also by partition key: each key's messages in their order, the
// keys in the order of their first message, so that a batch never mixes keys
// (or, on an entity that takes no batch of distinct message ids, one message
// a batch). A topic that can never be an entity path fails the whole topic
// (topic class, no batches). A message that cannot be mapped (see toMessage),
// too large for an empty batch, or without the session id a session-enabled
// entity requires, is left out and named in a message-class error, each with
// its reason.
func (p *Producer) Batches(ctx context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	if err := checkEntity(topic); err != nil {
		return nil, err
	}
	s, err := p.sender(topic)
	if err != nil {
		return nil, err
	}
	state := p.entityState(topic)
	var rej producer.Rejections
	mapped := map[int64]*azservicebus.Message{}
	valid := rej.Keep(msgs, func(m *producer.Message) (string, error) {
		if state.sessions && m.PartitionKey == "" {
			return ReasonSessionIDRequired, fmt.Errorf("row %d has no partition_key, and entity %s requires sessions: the partition key is sent as the session id",
				m.ID, producer.Quote(topic))
		}
		sb, reason, err := toMessage(m)
		if err != nil {
			return reason, err
		}
		m.Prepared = sb // Send takes a copy of it from there
		c := *sb        // the SDK's batch gets its own
		mapped[m.ID] = &c
		return "", nil
	})
	var out []producer.Batch
	for _, part := range parts(valid, state.mode) {
		group := make([]producer.Message, len(part))
		for j, i := range part {
			group[j] = valid[i]
		}
		batches, err := p.cut(ctx, s, topic, group, mapped, &rej)
		if err != nil {
			return nil, err
		}
		out = append(out, batches...)
	}
	return out, rej.Err()
}

// cut cuts msgs, in order, where the SDK says a batch is full or at MaxBatch.
func (p *Producer) cut(ctx context.Context, s sender, topic string, msgs []producer.Message, mapped map[int64]*azservicebus.Message,
	rej *producer.Rejections) ([]producer.Batch, error) {
	var (
		out      []producer.Batch
		cur      = producer.Batch{Topic: topic}
		sdkBatch messageBatch
		err      error
	)
	for i := range msgs {
		m := mapped[msgs[i].ID]
		if sdkBatch == nil || len(cur.Messages) == p.maxBatch {
			if len(cur.Messages) > 0 {
				out = append(out, cur)
				cur = producer.Batch{Topic: topic}
			}
			if sdkBatch, err = s.NewMessageBatch(ctx); err != nil {
				return nil, p.failed(ctx, topic, s, fmt.Errorf("new message batch for %q: %w", topic, err))
			}
		}
		err = sdkBatch.AddMessage(m, nil)
		if errors.Is(err, azservicebus.ErrMessageTooLarge) && sdkBatch.NumMessages() > 0 {
			// The batch may be full: try the message in a new one. Only if it
			// fits there does it start the next batch; a message too large for
			// any batch must not cut the current one short.
			next, nerr := s.NewMessageBatch(ctx)
			if nerr != nil {
				return nil, p.failed(ctx, topic, s, fmt.Errorf("new message batch for %q: %w", topic, nerr))
			}
			if err = next.AddMessage(m, nil); err == nil {
				out = append(out, cur)
				cur = producer.Batch{Topic: topic}
				sdkBatch = next
			}
		}
		switch {
		case errors.Is(err, azservicebus.ErrMessageTooLarge):
			rej.Add(msgs[i].ID, producer.ReasonMessageTooLarge,
				fmt.Errorf("row %d (%d bytes of payload) is too large for an empty Service Bus batch", msgs[i].ID, len(msgs[i].Payload)))
		case err != nil:
			rej.Add(msgs[i].ID, producer.ReasonInvalidMessage, fmt.Errorf("row %d: %w", msgs[i].ID, err))
		default:
			cur.Messages = append(cur.Messages, msgs[i])
		}
	}
	if len(cur.Messages) > 0 {
		out = append(out, cur)
	}
	return out, nil
}

// Send builds the batch again from its messages and sends it as one SDK batch,
// all or nothing: a batch Batches cut always fits. Should it not (the entity's
// size limit changed between the two), nothing is sent and the rows wait for
// the next tick, which cuts them again; sending part of it would send that part
// twice. It checks the topic and the rows again, as Batches does, and sends
// nothing when it refuses one.
//
// When the entity refuses the batch as mixed (a partitioned entity and several
// partition keys, or distinct message ids under duplicate detection: the
// batch was cut before the producer knew), Send cuts it again, by key or one
// message a batch, and sends the parts, those without a key first, then in
// the order of their first rows; the entity is cut so from then on. If a part
// fails after earlier parts went, the whole batch fails and the earlier parts'
// rows are sent again later (the message id is Service Bus's MessageID, so
// duplicate detection drops them where it is on).
func (p *Producer) Send(ctx context.Context, b producer.Batch) error {
	if err := checkEntity(b.Topic); err != nil {
		return err
	}
	mapped := make([]*azservicebus.Message, len(b.Messages))
	var rej producer.Rejections
	now := time.Now()
	for i := range b.Messages {
		m, reason, err := toMessage(&b.Messages[i])
		if err != nil {
			rej.Add(b.Messages[i].ID, reason, err)
			continue
		}
		// The row's deadline travels as the time left: the entity drops the
		// message once it passes (at least 1 ms; the service may round it up
		// to the entity's own minimum).
		if at := b.Messages[i].ExpiresAt; !at.IsZero() {
			ttl := max(at.Sub(now), time.Millisecond)
			m.TimeToLive = &ttl
		}
		mapped[i] = m
	}
	if err := rej.Err(); err != nil {
		return err
	}
	s, err := p.sender(b.Topic)
	if err != nil {
		return err
	}
	return p.sendCut(ctx, s, b, mapped)
}

// sendCut sends b (mapped holds its messages, in order) as one SDK batch, and
// cuts it again when the entity refuses it as mixed.
func (p *Producer) sendCut(ctx context.Context, s sender, b producer.Batch, mapped []*azservicebus.Message) error {
	err := p.sendOne(ctx, s, b, mapped)
	var mixed *mixedRefusal
	if !errors.As(err, &mixed) {
		return err
	}
	pieces := parts(b.Messages, p.learnMode(b.Topic, b, mixed.description))
	// Rows without a key go first: on an entity that is session-enabled as
	// well as partitioned, they are refused (the service may report the
	// mixed batch before the missing session id), and refused before any
	// other part went, the rest of the batch is sent again without having
	// been sent once already.
	slices.SortStableFunc(pieces, func(x, y []int) int {
		return cmp.Compare(keyRank(b.Messages[x[0]]), keyRank(b.Messages[y[0]]))
	})
	if len(pieces) < 2 {
		// One message, or one key already cut as the entity asks, and still
		// refused: nothing left to cut. The entity's configuration is at
		// fault: the topic's.
		return producer.NewTopicError("not_allowed", fmt.Errorf("entity %s refuses even a batch of %d messages with one partition key: %w",
			producer.Quote(b.Topic), len(b.Messages), mixed.err))
	}
	// The parts the entity accepted before one failed are delivered, and
	// the error says so (producer.Delivered): the sweeper sends them no
	// more, where it once sent them again for duplicate detection to drop.
	var sent []int64
	for _, part := range pieces {
		pb := producer.Batch{Topic: b.Topic, Messages: make([]producer.Message, len(part))}
		pm := make([]*azservicebus.Message, len(part))
		for j, i := range part {
			pb.Messages[j], pm[j] = b.Messages[i], mapped[i]
		}
		if err := p.sendCut(ctx, s, pb, pm); err != nil {
			slices.Sort(sent)
			return producer.WithDelivered(err, sent)
		}
		sent = append(sent, pb.IDs()...)
	}
	return nil
}

func keyRank(m producer.Message) int {
	if m.PartitionKey == "" {
		return 0
	}
	return 1
}

// mixedRefusal is the service's refusal of a batch that mixes partition keys,
// session ids or message ids, which sendCut answers by cutting it again.
type mixedRefusal struct {
	description string
	err         error
}

func (e *mixedRefusal) Error() string { return e.err.Error() }
func (e *mixedRefusal) Unwrap() error { return e.err }

// sendOne sends b as one SDK batch.
func (p *Producer) sendOne(ctx context.Context, s sender, b producer.Batch, mapped []*azservicebus.Message) error {
	sdkBatch, err := s.NewMessageBatch(ctx)
	if err != nil {
		return p.failed(ctx, b.Topic, s, fmt.Errorf("new message batch for %q: %w", b.Topic, err))
	}
	for i, m := range mapped {
		id := b.Messages[i].ID
		err = sdkBatch.AddMessage(m, nil)
		switch {
		case errors.Is(err, azservicebus.ErrMessageTooLarge) && sdkBatch.NumMessages() > 0:
			if alone, aerr := s.NewMessageBatch(ctx); aerr == nil && errors.Is(alone.AddMessage(m, nil), azservicebus.ErrMessageTooLarge) {
				// Too large for any batch: the row's, not the batch's.
				return producer.NewMessageError(producer.ReasonMessageTooLarge, []int64{id},
					fmt.Errorf("row %d (%d bytes of payload) is too large for an empty Service Bus batch: %w", id, len(b.Messages[i].Payload), err))
			}
			return producer.NewTransientError("batch_too_large",
				fmt.Errorf("the batch of %d rows for %q no longer fits one Service Bus batch at row %d; it is cut again at the next tick: %w",
					len(b.Messages), b.Topic, id, err))
		case errors.Is(err, azservicebus.ErrMessageTooLarge):
			return producer.NewMessageError(producer.ReasonMessageTooLarge, []int64{id}, err)
		case err != nil:
			return producer.NewMessageError(producer.ReasonInvalidMessage, []int64{id}, err)
		}
	}
	err = s.SendMessageBatch(ctx, sdkBatch)
	if err == nil {
		return nil
	}
	err = fmt.Errorf("send %d messages to %q: %w", sdkBatch.NumMessages(), b.Topic, err)
	switch kind, description := refusal(err); kind {
	case "mixed":
		return &mixedRefusal{description: description, err: err}
	case "session":
		if ids := withoutKey(b.Messages); len(ids) > 0 {
			p.learnSessions(b.Topic, description)
			return sessionRequired(b.Topic, ids, err)
		}
	case "unknown":
		p.logUnknown(b.Topic, description)
	}
	// The service rejects a whole batch for one message too large
	// (amqp:link:message-size-exceeded): pin it on the largest, so its
	// neighbours are not charged with it.
	return producer.PinOnLargest(p.failed(ctx, b.Topic, s, err), b)
}

// failed classifies err and drops the sender when the SDK has closed it.
func (p *Producer) failed(ctx context.Context, entity string, s sender, err error) error {
	var sbErr *azservicebus.Error
	if errors.As(err, &sbErr) && sbErr.Code == azservicebus.CodeClosed {
		p.forget(context.WithoutCancel(ctx), entity, s)
	}
	return classify(err)
}

// Close closes every sender and the client; sends after it fail with a local
// error.
func (p *Producer) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	senders := p.senders
	p.senders = map[string]sender{}
	p.mu.Unlock()
	var errs []error
	for entity, s := range senders {
		if err := s.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("close sender for %q: %w", entity, err))
		}
	}
	if err := p.closeClient(ctx); err != nil {
		errs = append(errs, fmt.Errorf("close Service Bus client: %w", err))
	}
	return errors.Join(errs...)
}

// Conditions Service Bus sends that name the destination as the problem.
var topicConditions = map[amqp.ErrCond]string{
	amqp.ErrCondNotFound:                          "not_found",
	amqp.ErrCondUnauthorizedAccess:                "unauthorized",
	amqp.ErrCondNotAllowed:                        "not_allowed",
	amqp.ErrCond("com.microsoft:entity-disabled"): "entity_disabled",
	// The entity is full (its quota, e.g. 1 GB, is reached): the ADR's case.
	// Other entities still take messages, so this trips the topic only.
	amqp.ErrCondResourceLimitExceeded: "entity_full",
}

// classify maps the SDK's errors onto the failure classes:
//
//   - *azservicebus.Error: unauthorized and not found → topic; connection lost
//     → broker (the service was not reached, whatever the rows held); timeout,
//     closed (the SDK closed the sender; the next send makes a new one) →
//     transient.
//   - raw AMQP errors: not-found, unauthorized-access, not-allowed,
//     entity-disabled, resource-limit-exceeded → topic; message-size-exceeded →
//     message; server-busy, timeout, internal error → transient.
//   - the AMQP connection failed → broker; a link or session detached (one
//     entity's, e.g. a forced detach) → transient.
//   - ErrMessageTooLarge → message.
//   - anything else → transient (the class of unclassified errors).
func classify(err error) error {
	if errors.Is(err, azservicebus.ErrMessageTooLarge) {
		return producer.NewMessageError(producer.ReasonMessageTooLarge, nil, err)
	}
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) {
		if reason, ok := topicConditions[amqpErr.Condition]; ok {
			return producer.NewTopicError(reason, err)
		}
		switch amqpErr.Condition {
		case amqp.ErrCondMessageSizeExceeded:
			return producer.NewMessageError(producer.ReasonMessageTooLarge, nil, err)
		case amqp.ErrCond("com.microsoft:server-busy"):
			return producer.NewTransientError("server_busy", err)
		case amqp.ErrCond("com.microsoft:timeout"):
			return producer.NewTransientError("timeout", err)
		}
	}
	var sbErr *azservicebus.Error
	if errors.As(err, &sbErr) {
		switch sbErr.Code {
		case azservicebus.CodeUnauthorizedAccess:
			return producer.NewTopicError("unauthorized", err)
		case azservicebus.CodeNotFound:
			return producer.NewTopicError("not_found", err)
		case azservicebus.CodeConnectionLost:
			return producer.NewBrokerError("connection_lost", err)
		case azservicebus.CodeTimeout:
			return producer.NewTransientError("timeout", err)
		case azservicebus.CodeClosed:
			return producer.NewTransientError("closed", err)
		}
	}
	var connErr *amqp.ConnError
	if errors.As(err, &connErr) {
		return producer.NewBrokerError("connection_lost", err)
	}
	var linkErr *amqp.LinkError
	var sessErr *amqp.SessionError
	if errors.As(err, &linkErr) || errors.As(err, &sessErr) {
		return producer.NewTransientError("link_detached", err)
	}
	return err
}

// MessagingSystem names the broker in the sweeper's spans (messaging.system).
func (p *Producer) MessagingSystem() string { return "servicebus" }
