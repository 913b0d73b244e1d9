// Package memory is a producer that keeps what it receives in memory. Tests use it
// to see exactly what the sweeper sent, and to make sends fail on purpose: a whole
// topic, the next calls, or particular messages, with a chosen failure class.
package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/outbox-sweeper/sweeper/producer"
)

// MaxBatchDefault is the default for [Config.MaxBatch].
const MaxBatchDefault = 100

// Config configures a [Producer].
type Config struct {
	// MaxBatch is the most messages one batch holds. Defaults to MaxBatchDefault.
	MaxBatch int
	// Partial makes a batch with a failed message (FailMessage) deliver the
	// messages before it, and say so (producer.Delivered), as brokers with
	// per-message acknowledgements do. False: a failed batch records nothing.
	Partial bool
}

// SendFunc is called at the start of every Send, before anything is recorded. A
// non-nil error fails the send. Tests use it to block a send until its context is
// cancelled, or to observe batches as they go.
type SendFunc func(ctx context.Context, b producer.Batch) error

// Producer records every message it accepts. It is safe for concurrent use.
type Producer struct {
	maxBatch int
	partial  bool

	mu          sync.Mutex
	batches     []producer.Batch
	calls       int
	closed      bool
	failCalls   []error
	failMessage map[int64]error
	failTopic   map[string]error
	sendFunc    SendFunc
	check       func(context.Context) error
}

var (
	_ producer.Producer = (*Producer)(nil)
	_ producer.Checker  = (*Producer)(nil)
)

// New returns an empty producer.
func New(cfg Config) *Producer {
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = MaxBatchDefault
	}
	return &Producer{
		maxBatch:    cfg.MaxBatch,
		partial:     cfg.Partial,
		failMessage: make(map[int64]error),
		failTopic:   make(map[string]error),
	}
}

// Batches cuts msgs into runs of at most MaxBatch messages.
func (p *Producer) Batches(_ context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	var out []producer.Batch
	for chunk := range slices.Chunk(msgs, p.maxBatch) {
		out = append(out, producer.Batch{Topic: topic, Messages: chunk})
	}
	return out, nil
}

// Send records b, unless a failure was set up for it. Failures are checked in this
// order: the send func, the next queued call failure, the topic, the messages.
// A failed batch records nothing, unless Config.Partial.
func (p *Producer) Send(ctx context.Context, b producer.Batch) error {
	p.mu.Lock()
	fn := p.sendFunc
	p.mu.Unlock()
	if fn != nil {
		if err := fn(ctx, b); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.closed {
		return producer.NewLocalError(errors.New("memory producer is closed"))
	}
	if len(p.failCalls) > 0 {
		err := p.failCalls[0]
		p.failCalls = p.failCalls[1:]
		return err
	}
	if err, ok := p.failTopic[b.Topic]; ok {
		return err
	}
	var badIDs []int64
	var firstErr error
	first := -1
	for i, m := range b.Messages {
		if err, ok := p.failMessage[m.ID]; ok {
			badIDs = append(badIDs, m.ID)
			if firstErr == nil {
				firstErr, first = err, i
			}
		}
	}
	if len(badIDs) > 0 {
		err := firstErr
		if producer.ClassOf(firstErr) == producer.ClassMessage {
			err = producer.NewMessageError(producer.ReasonOf(firstErr), badIDs, firstErr)
			if p.partial {
				// The broker stopped at the first refused message.
				err = producer.NewMessageError(producer.ReasonOf(firstErr), badIDs[:1], firstErr)
			}
		}
		if p.partial && first > 0 {
			took := producer.Batch{Topic: b.Topic, Messages: slices.Clone(b.Messages[:first])}
			p.batches = append(p.batches, took)
			err = producer.WithDelivered(err, took.IDs())
		}
		return err
	}
	b.Messages = slices.Clone(b.Messages)
	p.batches = append(p.batches, b)
	return nil
}

// Close marks the producer closed; later sends fail with a local error.
func (p *Producer) Close(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

// FailTopic makes every send to topic fail with err until [Producer.HealTopic].
// Build err with the producer package's constructors to choose its class.
func (p *Producer) FailTopic(topic string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failTopic[topic] = err
}

// HealTopic undoes [Producer.FailTopic].
func (p *Producer) HealTopic(topic string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.failTopic, topic)
}

// FailNextCalls makes the next n sends fail with err, whatever their topic.
func (p *Producer) FailNextCalls(n int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for range n {
		p.failCalls = append(p.failCalls, err)
	}
}

// FailMessage makes every batch that holds row id fail with err. When err is of
// the message class, the error returned names every such row of the batch.
func (p *Producer) FailMessage(id int64, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failMessage[id] = err
}

// Check implements producer.Checker: nil (the broker is up) unless a check was
// set with [Producer.SetCheck], or the producer is closed.
func (p *Producer) Check(ctx context.Context) error {
	p.mu.Lock()
	check, closed := p.check, p.closed
	p.mu.Unlock()
	if closed {
		return producer.NewLocalError(errors.New("memory producer is closed"))
	}
	if check != nil {
		return check(ctx)
	}
	return nil
}

// SetCheck makes Check call fn (nil: the broker is up), so tests can say the
// broker is down while its sends fail.
func (p *Producer) SetCheck(fn func(context.Context) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.check = fn
}

// SetSendFunc installs fn (nil removes it); see [SendFunc].
func (p *Producer) SetSendFunc(fn SendFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sendFunc = fn
}

// Batches returns a copy of the batches accepted so far, in the order they were.
func (p *Producer) Accepted() []producer.Batch {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.batches)
}

// Messages returns every accepted message, in the order they were accepted.
func (p *Producer) Messages() []producer.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []producer.Message
	for _, b := range p.batches {
		out = append(out, b.Messages...)
	}
	return out
}

// Calls returns how many times Send got past its send func.
func (p *Producer) Calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// String is for test failure messages.
func (p *Producer) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, b := range p.batches {
		n += len(b.Messages)
	}
	return fmt.Sprintf("memory producer: %d batches, %d messages, %d calls", len(p.batches), n, p.calls)
}

// MessagingSystem names the broker in the sweeper's spans (messaging.system).
func (p *Producer) MessagingSystem() string { return "memory" }
