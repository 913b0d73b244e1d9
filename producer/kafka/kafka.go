// Package kafka is a producer that produces outbox messages to Apache Kafka
// and what speaks its protocol (Redpanda, Amazon MSK, Confluent Cloud, Azure
// Event Hubs' Kafka endpoint), with github.com/twmb/franz-go.
//
// The topic is the Kafka topic, after an optional prefix. A batch is produced
// and every record's acknowledgement awaited (acks=all) before Send returns.
// The producer is idempotent by default: the broker drops a record the client
// retried after a lost answer, and with at most five requests in flight per
// broker it keeps each partition's records in the order they were produced,
// across the client's own retries and reconnects.
//
// Mapping: partition_key → the record key (rows without one have no key and
// are spread over the partitions: no order holds among them unless the topic
// has one partition); message_id → header message-id, correlation_id →
// correlation-id, content_type → content-type; the row's headers follow,
// strings as they are and other JSON values as their JSON text.
//
// Failure classes: an unknown topic, a topic the credentials may not write,
// an invalid topic name are topic class; a record over the topic's
// max.message.bytes is message class and names its row, as does a record the
// broker refuses as invalid (named when it is alone, else the sweeper splits
// the batch to find it); brokers that cannot be reached, and credentials the
// cluster refuses, are broker class (no attempts); a broker that times out or
// lacks in-sync replicas is transient.
package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/outbox-sweeper/sweeper/producer"
)

// Defaults for [Config].
const (
	MaxBatchDefault        = 500
	MaxMessageBytesDefault = 1_000_012 // Kafka's own default of max.message.bytes
	DialTimeoutDefault     = 10 * time.Second
)

// Config configures a [Producer].
type Config struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// TopicPrefix is put before each row's topic to name the Kafka topic.
	TopicPrefix string
	// ClientID names the client in the brokers' logs and quotas. Defaults to
	// "outbox-sweeper".
	ClientID string
	// TLS, when set, is used for every connection.
	TLS *tls.Config
	// SASL, when set, authenticates every connection.
	SASL sasl.Mechanism
	// MaxBatch is the most records one Send produces. Defaults to
	// MaxBatchDefault.
	MaxBatch int
	// MaxMessageBytes is the largest record batch a topic takes when its
	// max.message.bytes cannot be read (the credentials may not describe the
	// topic's configuration). Defaults to MaxMessageBytesDefault.
	MaxMessageBytes int
	// NotIdempotent turns the idempotent producer off, for clusters that
	// refuse it (IDEMPOTENT_WRITE not granted): the client then keeps one
	// request in flight per broker, so that order still holds, and a retry
	// after a lost answer may store a record twice.
	NotIdempotent bool
	// DialTimeout bounds each connection attempt. Defaults to
	// DialTimeoutDefault.
	DialTimeout time.Duration
}

// Producer produces to Kafka. It is safe for concurrent use.
type Producer struct {
	cfg Config
	cl  *kgo.Client

	// limits holds each topic's max.message.bytes, read from the cluster
	// once (or the fallback, when it cannot be read); exists, the topics
	// known to exist: a send to any other first asks the cluster's metadata.
	// limitsMu guards both.
	limitsMu sync.Mutex
	limits   map[string]int
	exists   map[string]bool
	// reached is set while the last send reached the brokers; a send made
	// while it is not first checks that a broker answers, so that a cluster
	// that is down fails the send at once rather than at its deadline.
	reached atomic.Bool
	closed  atomic.Bool
}

var (
	_ producer.Producer = (*Producer)(nil)
	_ producer.Checker  = (*Producer)(nil)
)

// New returns a producer. It connects on first use, so brokers that are down
// at start are waited for, not fatal.
func New(cfg Config) (*Producer, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("kafka: no seed brokers (--kafka-brokers)")
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "outbox-sweeper"
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = MaxBatchDefault
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = MaxMessageBytesDefault
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DialTimeoutDefault
	}
	p := &Producer{cfg: cfg, limits: map[string]int{}, exists: map[string]bool{}}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.DialTimeout(cfg.DialTimeout),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// A Send produces its whole batch at once and waits: lingering would
		// only add to every batch's time.
		kgo.ProducerLinger(0),
		// Room for every topic in flight: a full buffer would make Produce
		// block one topic on another's acks.
		kgo.MaxBufferedRecords(64 * cfg.MaxBatch),
		// The batch cap franz-go cuts to and checks records against is the
		// topic's own limit, read before the topic's first send.
		kgo.ProducerBatchMaxBytesFn(func(topic string) int32 { return int32(p.limit(topic)) }),
		// A Send's context bounds it, in-flight records included: the
		// sweeper's --send-timeout must end a send to a broker that hangs.
		// Such a batch may then be stored twice (the sweeper sends it again),
		// which at-least-once allows; order holds, as a retry goes after.
		kgo.AllowIdempotentProduceCancellation(),
	}
	if cfg.NotIdempotent {
		opts = append(opts, kgo.DisableIdempotentWrite(), kgo.MaxProduceRequestsInflightPerBroker(1))
	}
	if cfg.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(cfg.TLS))
	}
	if cfg.SASL != nil {
		opts = append(opts, kgo.SASL(cfg.SASL))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	p.cl = cl
	return p, nil
}

// Connect checks that a broker answers, so that a start-up can report a
// cluster it cannot reach.
func (p *Producer) Connect(ctx context.Context) error { return p.Check(ctx) }

// Batches cuts msgs into batches of at most MaxBatch records and at most the
// topic's max.message.bytes, so that the records of one partition fit one
// record batch. A topic whose Kafka name is invalid fails whole (topic class,
// no batches). Rows that can never be produced (see toRecord), or larger than
// the topic's max.message.bytes as last read, are left out and named in a
// message-class error, each with its reason.
//
// Cutting needs no connection: before the topic's limit has been read it
// checks no size (the send reads the limit first and refuses a record over
// it), since a cut that fails on a cluster that is down would count an
// attempt on every row without the broker breaker seeing a failed send.
func (p *Producer) Batches(_ context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	if p.closed.Load() {
		return nil, producer.NewLocalError(errors.New("kafka producer is closed"))
	}
	name := p.cfg.TopicPrefix + topic
	if err := checkTopic(name); err != nil {
		return nil, err
	}
	limit, known := p.knownLimit(name)
	var rej producer.Rejections
	valid := rej.Keep(msgs, func(m *producer.Message) (string, error) {
		r, reason, err := toRecord(name, m)
		if err != nil {
			return reason, err
		}
		m.Prepared = r // Send takes it from there
		if known {
			return tooLarge(m.ID, r, name, limit)
		}
		return "", nil
	})
	out, _, _ := producer.Split(topic, valid, producer.Limits{
		Messages: p.cfg.MaxBatch,
		Bytes:    limit - recordBatchOverhead,
		Size:     func(m *producer.Message) int { return recordSize(m.Prepared.(*kgo.Record)) },
	})
	return out, rej.Err()
}

// tooLarge refuses a record that could not fit a record batch of its own
// within limit, the topic's max.message.bytes.
func tooLarge(id int64, r *kgo.Record, topic string, limit int) (string, error) {
	if n := recordSize(r) + recordBatchOverhead; n > limit {
		return producer.ReasonMessageTooLarge, fmt.Errorf(
			"row %d: record of about %d bytes is over topic %s's max.message.bytes of %d", id, n, producer.Quote(topic), limit)
	}
	return "", nil
}

// Send produces the batch and waits for every record's acknowledgement. It
// checks the topic and the rows again, as Batches does: a Send may get any
// batch. A row it refuses makes it produce nothing, and names that row.
func (p *Producer) Send(ctx context.Context, b producer.Batch) error {
	if p.closed.Load() {
		return producer.NewLocalError(errors.New("kafka producer is closed"))
	}
	name := p.cfg.TopicPrefix + b.Topic
	if err := checkTopic(name); err != nil {
		return err
	}
	// The records Batches built, copied: a produce keeps its state in the
	// record (its context among them), and a batch may be sent again.
	recs := make([]*kgo.Record, len(b.Messages))
	slab := make([]kgo.Record, len(b.Messages))
	var rej producer.Rejections
	for i := range b.Messages {
		r, reason, err := toRecord(name, &b.Messages[i])
		if err != nil {
			rej.Add(b.Messages[i].ID, reason, err)
			continue
		}
		slab[i] = *r
		slab[i].Context = nil
		recs[i] = &slab[i]
	}
	if err := rej.Err(); err != nil {
		return err
	}
	if !p.reached.Load() {
		if err := p.Check(ctx); err != nil {
			return err
		}
	}
	if err := p.ensureTopic(ctx, name); err != nil {
		return err
	}
	limit, err := p.topicLimit(ctx, name)
	if err != nil {
		return err
	}
	for i, r := range recs {
		if reason, err := tooLarge(b.Messages[i].ID, r, name, limit); err != nil {
			rej.Add(b.Messages[i].ID, reason, err)
		}
	}
	if err := rej.Err(); err != nil {
		return err
	}

	results := p.cl.ProduceSync(ctx, recs...)
	// ProduceSync gives the results in the order the records finished, not
	// the order they were given: find each one's row by its record.
	if results.FirstErr() == nil {
		p.reached.Store(true)
		return nil
	}
	index := make(map[*kgo.Record]int, len(recs))
	for i, r := range recs {
		index[r] = i
	}
	// Each partition's record batch succeeds or fails on its own: a failure
	// names the rows whose records were written (producer.Delivered), which
	// the sweeper sends no more.
	var written []int64
	for _, res := range results {
		if i, ok := index[res.Record]; ok && res.Err == nil {
			written = append(written, b.Messages[i].ID)
		}
	}
	slices.Sort(written)
	var failed []producer.Message // rows whose records failed for what they are
	var worst error
	for _, res := range results {
		if res.Err == nil {
			continue
		}
		i, ok := index[res.Record]
		if !ok {
			return producer.WithDelivered(fmt.Errorf("produce to topic %s: a result for a record this send did not produce: %w", producer.Quote(name), res.Err), written)
		}
		err := p.classify(ctx, fmt.Errorf("produce to topic %s: %w", producer.Quote(name), res.Err))
		switch producer.ClassOf(err) {
		case producer.ClassTopic:
			p.forget(name) // the next send asks the cluster first, and fails at once
			return producer.WithDelivered(err, written)
		case producer.ClassBroker, producer.ClassLocal:
			// Whatever the other records say, this says most.
			return producer.WithDelivered(err, written)
		case producer.ClassMessage:
			failed = append(failed, b.Messages[i])
			if worst == nil {
				worst = err
			}
		default:
			if worst == nil || producer.ClassOf(worst) == producer.ClassMessage {
				worst = err
			}
		}
	}
	if producer.ClassOf(worst) != producer.ClassMessage {
		p.reached.Store(false) // the next send checks the brokers first
		return producer.WithDelivered(worst, written)
	}
	// The broker refuses a record batch whole, so every record of the
	// partition's batch fails with the one that caused it. Alone, it is
	// that row's; else the sweeper splits the batch until the rows that
	// fail stand alone (a batch too large as a whole is no row's).
	if len(failed) == 1 {
		return producer.WithDelivered(producer.NewMessageError(producer.ReasonOf(worst), []int64{failed[0].ID}, worst), written)
	}
	return producer.WithDelivered(worst, written)
}

// ensureTopic makes sure topic exists and may be written before the first
// send to it (and the first after a topic-class failure): a metadata request
// for it alone, which does not ask the cluster to create it. franz-go, given
// records for a topic that does not exist, retries its metadata before
// failing them, and after a first failure can hold them until the send's
// deadline: a missing topic would then hold its page for --send-timeout and
// charge its rows an attempt as a timeout.
func (p *Producer) ensureTopic(ctx context.Context, topic string) error {
	p.limitsMu.Lock()
	ok := p.exists[topic]
	p.limitsMu.Unlock()
	if ok {
		return nil
	}
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = false
	resp, err := req.RequestWith(ctx, p.cl)
	if err != nil {
		return p.classify(ctx, fmt.Errorf("metadata of topic %s: %w", producer.Quote(topic), err))
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return p.classify(ctx, fmt.Errorf("produce to topic %s: %w", producer.Quote(topic), err))
		}
		p.limitsMu.Lock()
		p.exists[topic] = true
		p.limitsMu.Unlock()
		return nil
	}
	return fmt.Errorf("metadata of topic %s: the cluster's answer does not name it", producer.Quote(topic))
}

// forget drops topic from the topics known to exist.
func (p *Producer) forget(topic string) {
	p.limitsMu.Lock()
	defer p.limitsMu.Unlock()
	delete(p.exists, topic)
}

// knownLimit returns topic's max.message.bytes if it has been read, else the
// fallback for cutting batches.
func (p *Producer) knownLimit(topic string) (int, bool) {
	p.limitsMu.Lock()
	defer p.limitsMu.Unlock()
	if n, ok := p.limits[topic]; ok {
		return n, true
	}
	return p.cfg.MaxMessageBytes, false
}

// limit is franz-go's batch cap for topic: its max.message.bytes, within the
// range franz-go accepts.
func (p *Producer) limit(topic string) int {
	n, _ := p.knownLimit(topic)
	return min(max(n, 512), 1<<30)
}

// topicLimit returns topic's max.message.bytes, reading it from the cluster
// the first time. A topic that does not exist (yet) is asked again next
// time; a cluster that does not let the credentials describe the topic gets
// the configured fallback for good.
//
// A first send that gets no answer fails, transient: franz-go takes its batch
// cap for the topic's partitions once, when it first meets them, so producing
// with the fallback could hold a larger topic to it for the process's life.
func (p *Producer) topicLimit(ctx context.Context, topic string) (int, error) {
	if n, ok := p.knownLimit(topic); ok {
		return n, nil
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeTopic
	res.ResourceName = topic
	res.ConfigNames = []string{"max.message.bytes"}
	req.Resources = append(req.Resources, res)
	n, keep := p.cfg.MaxMessageBytes, true
	resp, err := req.RequestWith(ctx, p.cl)
	switch {
	case err != nil:
		return 0, producer.NewTransientError("no_topic_config", fmt.Errorf(
			"read topic %s's max.message.bytes before its first send: %w", producer.Quote(topic), err))
	case len(resp.Resources) == 1:
		r := resp.Resources[0]
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			keep = !errors.Is(err, kerr.UnknownTopicOrPartition)
			break
		}
		for _, c := range r.Configs {
			if c.Name == "max.message.bytes" && c.Value != nil {
				if v, err := strconv.Atoi(*c.Value); err == nil && v > 0 {
					n = v
				}
			}
		}
	}
	if keep {
		p.limitsMu.Lock()
		p.limits[topic] = n
		p.limitsMu.Unlock()
	}
	return n, nil
}

// classify maps a failed record's error onto the failure classes.
func (p *Producer) classify(ctx context.Context, err error) error {
	var kErr *kerr.Error
	switch {
	case errors.Is(err, kgo.ErrClientClosed):
		return producer.NewLocalError(err)
	case ctx.Err() != nil:
		return err // cancelled (local) or the send's deadline (transient)
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return producer.NewMessageError(producer.ReasonMessageTooLarge, nil, err)
	case errors.Is(err, kerr.InvalidRecord):
		return producer.NewMessageError(producer.ReasonInvalidMessage, nil, err)
	case errors.Is(err, kerr.InvalidTimestamp), errors.Is(err, kerr.UnsupportedForMessageFormat):
		// Records carry the send's time and always headers: the topic's
		// message.timestamp settings, the sweeper host's clock or an old
		// message format refuse them all, whatever the row.
		return producer.NewTopicError("topic_config", fmt.Errorf("%w (check the topic's message.timestamp.* and message.format settings, and this host's clock)", err))
	case errors.Is(err, kerr.CorruptMessage):
		return producer.NewTransientError("corrupt_message", err) // a checksum that failed on the way
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		return producer.NewTopicError("topic_not_found", fmt.Errorf("%w (create the topic, or check --kafka-topic-prefix)", err))
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return producer.NewTopicError("unauthorized", fmt.Errorf("%w (grant the sweeper's principal WRITE on the topic)", err))
	case errors.Is(err, kerr.InvalidTopicException):
		return producer.NewTopicError("invalid_topic", err)
	case errors.Is(err, kerr.ClusterAuthorizationFailed):
		return producer.NewBrokerError("unauthorized", fmt.Errorf("%w (the idempotent producer needs IDEMPOTENT_WRITE on the cluster; grant it, or set --kafka-idempotent=false)", err))
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.IllegalSaslState),
		errors.Is(err, kerr.UnsupportedSaslMechanism):
		return producer.NewBrokerError("authentication_failed", err)
	case errors.As(err, &kErr):
		return producer.NewTransientError(strings.ToLower(kErr.Message), err)
	}
	return err // ClassOf tells a failed connection (broker) from the rest (transient)
}

// Check tells whether a broker answers: a metadata request that names no
// topic, which produces nothing. It returns by ctx's end; a ctx without a
// deadline is bounded by DialTimeout.
func (p *Producer) Check(ctx context.Context) error {
	if p.closed.Load() {
		return producer.NewLocalError(errors.New("kafka producer is closed"))
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.cfg.DialTimeout)
		defer cancel()
	}
	if err := p.cl.Ping(ctx); err != nil {
		p.reached.Store(false)
		err = fmt.Errorf("no Kafka broker of %s answers: %w", strings.Join(p.cfg.Brokers, ","), err)
		if c := p.classify(context.Background(), err); producer.ClassOf(c) == producer.ClassBroker {
			return c
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			return err
		}
		return producer.NewBrokerError("connection_lost", err)
	}
	p.reached.Store(true)
	return nil
}

// Close closes the client: a send in flight ends with a local error, and so
// does every send after it.
func (p *Producer) Close(context.Context) error {
	if p.closed.Swap(true) {
		return nil
	}
	p.cl.Close()
	return nil
}

// MessagingSystem names the broker in the sweeper's spans (messaging.system).
func (p *Producer) MessagingSystem() string { return "kafka" }
