package servicebus

import (
	"errors"
	"fmt"
	"strings"

	"github.com/Azure/go-amqp"

	"github.com/outbox-sweeper/sweeper/producer"
)

// ReasonSessionIDRequired is the dead-letter reason of a row without a
// partition_key sent to a session-enabled entity, which takes only messages
// with a session id.
const ReasonSessionIDRequired = "session_id_required"

// How a batch of one entity is cut, from the least to the most restrictive.
// Partitioned entities take a batch only if its messages share a session id
// and partition key (a batch is one transaction, and a transaction cannot span
// partitions); with duplicate detection on, they refuse distinct message ids
// in one batch as well, which leaves one message a batch.
type cutMode int

const (
	cutBySize   cutMode = iota // the SDK's size and MaxBatch only
	cutByKey                   // also one partition key (session id) a batch
	cutOneByOne                // one message a batch
)

func (m cutMode) String() string {
	switch m {
	case cutByKey:
		return "one partition key a batch"
	case cutOneByOne:
		return "one message a batch"
	}
	return "by size"
}

// entity is what the producer has learnt of an entity from its answers.
type entity struct {
	mode cutMode
	// sessions says the entity requires a session id: rows without a key
	// are refused before they are sent.
	sessions bool
}

// The service answers several different problems with amqp:not-allowed; only
// the description tells them apart. These are the ones the producer knows,
// as public threads show them (Azure/azure-service-bus#103,
// Azure/amqpnetlite#120, Azure/azure-service-bus-dotnet#565,
// Particular/NServiceBus#5364).
const (
	// "Batching brokered messages with distinct SessionId or PartitionKey is
	// not supported for an entity with partitioning enabled." and "…with
	// distinct SessionId, PartitionKey, or MessageId is not supported for an
	// entity with partitioning and duplicate detection enabled."
	descMixedBatch = "Batching brokered messages with distinct"
	// "The SessionId was not set on a message, and it cannot be sent to the
	// entity. Entities that have session support enabled can only receive
	// messages that have the SessionId set to a valid value."
	descNoSessionID = "The SessionId was not set on a message"
)

// refusal says what an amqp:not-allowed answer means: "mixed" (the batch
// mixes keys or ids the entity cannot batch), "session" (a message lacks the
// session id the entity requires), "unknown" (another not-allowed), or "" for
// any other error.
func refusal(err error) (kind, description string) {
	var amqpErr *amqp.Error
	if !errors.As(err, &amqpErr) || amqpErr.Condition != amqp.ErrCondNotAllowed {
		return "", ""
	}
	switch d := amqpErr.Description; {
	case strings.Contains(d, descMixedBatch):
		return "mixed", d
	case strings.Contains(d, descNoSessionID):
		return "session", d
	default:
		return "unknown", d
	}
}

// entityState returns what the producer knows of name: its cut mode (at least
// cutByKey with Config.BatchByKey) and whether it requires sessions.
func (p *Producer) entityState(name string) entity {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.entities[name]
	if p.batchByKey && e.mode < cutByKey {
		e.mode = cutByKey
	}
	return e
}

// learnMode notes that name refused batch b as mixed, and returns how b must
// be cut again: by key when it holds several keys, else one message a batch.
// The entity is cut at least so for the rest of the run (logged once at
// info).
func (p *Producer) learnMode(name string, b producer.Batch, description string) cutMode {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.entities[name]
	// Judged by the refused batch itself, not by what the entity was cut
	// with: batches cut before the producer learnt (the rest of a page, the
	// halves of a split) still mix keys, and their refusal says nothing new.
	next := cutByKey
	if distinctKeys(b.Messages) == 1 {
		next = cutOneByOne // one key and still refused: duplicate detection on a partitioned entity
	}
	if next > e.mode {
		e.mode = next
		p.entities[name] = e
		p.logger.Info("Service Bus refused a batch as mixed: this entity's batches are cut "+next.String()+" for the rest of the run",
			"entity", producer.Quote(name), "service_said", description,
			"hint", "--servicebus-batch-by-key cuts by key from the start")
	}
	return next
}

// learnSessions notes that name requires a session id on every message.
func (p *Producer) learnSessions(name, description string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.entities[name]
	if e.sessions {
		return
	}
	e.sessions = true
	p.entities[name] = e
	p.logger.Info("Service Bus entity requires sessions: rows without a partition_key are dead-lettered as "+ReasonSessionIDRequired,
		"entity", producer.Quote(name), "service_said", description)
}

// logUnknown logs an amqp:not-allowed description the producer does not know,
// in full, once per description, so that an operator can report it.
func (p *Producer) logUnknown(name, description string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := strings.Join(strings.Fields(stripTracking(description)), " ")
	if p.unknown[key] {
		return
	}
	p.unknown[key] = true
	p.logger.Warn("Service Bus refused a send with amqp:not-allowed and a description this producer does not know: "+
		"the topic trips. Please report the description (github.com/outbox-sweeper/sweeper issues) so that it can be handled",
		"entity", producer.Quote(name), "description", description)
}

// stripTracking cuts the per-request part of a description (Reference,
// TrackingId, SystemTracker, Timestamp), which differs at every answer.
func stripTracking(d string) string {
	for _, marker := range []string{" Reference:", " TrackingId:", "Reference:"} {
		if i := strings.Index(d, marker); i >= 0 {
			d = d[:i]
		}
	}
	return d
}

// parts orders msgs for cutting in mode, as lists of their indexes: by key,
// the messages of each key in their order, the keys in the order of their
// first message; one message a part for cutOneByOne; otherwise all of them
// as they are. The cut starts a new batch at every part.
func parts(msgs []producer.Message, mode cutMode) [][]int {
	var out [][]int
	switch mode {
	case cutBySize:
		all := make([]int, len(msgs))
		for i := range all {
			all[i] = i
		}
		return [][]int{all}
	case cutOneByOne:
		for i := range msgs {
			out = append(out, []int{i})
		}
		return out
	}
	index := map[string]int{}
	for i, m := range msgs {
		k, ok := index[m.PartitionKey]
		if !ok {
			k = len(out)
			index[m.PartitionKey] = k
			out = append(out, nil)
		}
		out[k] = append(out[k], i)
	}
	return out
}

func distinctKeys(msgs []producer.Message) int {
	seen := map[string]bool{}
	for _, m := range msgs {
		seen[m.PartitionKey] = true
	}
	return len(seen)
}

// withoutKey returns the ids of msgs that have no partition key.
func withoutKey(msgs []producer.Message) []int64 {
	var ids []int64
	for _, m := range msgs {
		if m.PartitionKey == "" {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

func sessionRequired(name string, ids []int64, err error) error {
	return producer.NewMessageError(ReasonSessionIDRequired, ids, fmt.Errorf(
		"rows %v have no partition_key, and entity %s requires sessions: the partition key is sent as the session id: %w",
		ids, producer.Quote(name), err))
}
