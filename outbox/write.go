package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Message is a message an application writes to the outbox.
type Message struct {
	// Topic is the destination: a Service Bus queue or topic, a RabbitMQ routing
	// key, a NATS subject. Required.
	Topic string
	// Payload is the body, passed to the broker as it is. Nil is stored as an
	// empty body.
	Payload []byte
	// MessageID is the idempotency key the broker sees, a UUID in text form.
	// Empty lets the database generate one. Set it to know the id before commit,
	// or to make an application retry write the same message twice knowingly.
	MessageID string
	// Headers become the broker's application properties. Nil means none.
	Headers map[string]any
	// ContentType, CorrelationID and PartitionKey map to the broker's fields.
	// Empty stores NULL.
	ContentType   string
	CorrelationID string
	PartitionKey  string
}

// DBTX is what [Writer.Write] needs of a database handle. pgx.Tx, *pgx.Conn,
// *pgxpool.Pool and pgxpool's Tx all satisfy it. Pass the transaction that makes
// the business change, so the message commits (or rolls back) with it.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
}

// CopyThresholdDefault is how many messages one Write call needs before it uses
// COPY instead of one multi-row INSERT. Below it the INSERT is as fast and keeps
// to plain statements; above it COPY is several times faster.
const CopyThresholdDefault = 1000

// Writer writes messages to one outbox table. It holds no connection and is safe
// for concurrent use; create one per table and keep it.
type Writer struct {
	table      Table
	insertOne  string
	insertMany string
}

// NewWriter returns a writer for table t (zero fields take their defaults).
func NewWriter(t Table) (*Writer, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &Writer{
		table:      t,
		insertOne:  t.statement("insert_message"),
		insertMany: t.statement("insert_messages"),
	}, nil
}

// Write inserts msgs through db in one round trip: one INSERT for one message, one
// multi-row INSERT below [CopyThresholdDefault] messages, COPY from it on. Ids ascend in
// the order of msgs. An invalid message fails the whole call before anything is
// sent, with an error naming it; the caller's transaction is then untouched.
func (w *Writer) Write(ctx context.Context, db DBTX, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	cols := make([]columns, len(msgs))
	for i := range msgs {
		c, err := toColumns(&msgs[i])
		if err != nil {
			return fmt.Errorf("outbox message %d of %d: %w", i+1, len(msgs), err)
		}
		cols[i] = c
	}

	switch {
	case len(msgs) == 1:
		c := cols[0]
		if _, err := db.Exec(ctx, w.insertOne, c.messageID, c.topic, c.payload, c.headers, c.contentType, c.correlationID, c.partitionKey); err != nil {
			return fmt.Errorf("insert outbox message into %s: %w", w.table, err)
		}
	case len(msgs) < CopyThresholdDefault:
		var a arrays
		a.grow(len(cols))
		for _, c := range cols {
			a.add(c)
		}
		if _, err := db.Exec(ctx, w.insertMany, a.messageID, a.topic, a.payload, a.headers, a.contentType, a.correlationID, a.partitionKey); err != nil {
			return fmt.Errorf("insert %d outbox messages into %s: %w", len(msgs), w.table, err)
		}
	default:
		// COPY writes the columns as given, so defaults do not apply: the message
		// id is generated here instead.
		rows := make([][]any, len(cols))
		for i, c := range cols {
			id := c.messageID
			if !id.Valid {
				id = pgtype.UUID{Bytes: uuid.New(), Valid: true}
			}
			rows[i] = []any{id, c.topic, c.payload, c.headers, c.contentType, c.correlationID, c.partitionKey}
		}
		_, err := db.CopyFrom(ctx, pgx.Identifier{w.table.Schema, w.table.Name},
			[]string{"message_id", "topic", "payload", "headers", "content_type", "correlation_id", "partition_key"},
			pgx.CopyFromRows(rows))
		if err != nil {
			return fmt.Errorf("copy %d outbox messages into %s: %w", len(msgs), w.table, err)
		}
	}
	return nil
}

// WriteOrdered is Write for applications whose transactions write the same
// topic concurrently and need its messages delivered in commit order.
//
// Why it is needed: the sweeper sends each topic in id order, and ids are drawn
// at insert, not at commit. Two transactions writing one topic at once may
// commit in the other order: the row with the lower id then becomes visible
// after the higher one, which may have been sent already. WriteOrdered first
// takes a transaction-scoped advisory lock per topic of msgs (in byte order of
// the names, so two writers cannot deadlock on them), so a second transaction
// writing the same topic waits until the first commits or rolls back, and draws
// its ids after it: per topic, id order is commit order.
//
// The price is that such transactions are serialized per topic from this call
// to their end: keep them short after it. tx must be the transaction that makes
// the business change (the locks end with it). Applications in other languages
// take the same lock, before their insert, with
//
//	SELECT pg_advisory_xact_lock(hashtextextended('outbox-writer <schema>.<table> <topic>', 0))
//
// Transactions that write several topics through several calls can deadlock if
// they lock the same topics in different orders; Postgres then aborts one of
// them with an error, and nothing is written.
func (w *Writer) WriteOrdered(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	names := make([]string, 0, 1)
	for i, m := range msgs {
		if m.Topic == "" {
			return fmt.Errorf("outbox message %d of %d: topic is empty: every message needs a destination", i+1, len(msgs))
		}
		names = append(names, m.Topic)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	keys := make([]string, len(names))
	for i, n := range names {
		keys[i] = "outbox-writer " + w.table.String() + " " + n
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) FROM unnest($1::text[]) AS k", keys); err != nil {
		return fmt.Errorf("lock outbox topics %q of %s for ordered writes: %w", names, w.table, err)
	}
	return w.Write(ctx, tx, msgs...)
}

// columns is one message in the form the statements take. Nil pointers and an
// invalid UUID are NULL. pgtype.UUID, unlike uuid.UUID, encodes without pgx
// trying (and failing) other plans first, which showed in profiles of COPY.
type columns struct {
	messageID     pgtype.UUID
	topic         string
	payload       []byte
	headers       []byte
	contentType   *string
	correlationID *string
	partitionKey  *string
}

func toColumns(m *Message) (columns, error) {
	c := columns{topic: m.Topic, payload: m.Payload}
	if m.Topic == "" {
		return c, errors.New("topic is empty: every message needs a destination")
	}
	if c.payload == nil {
		c.payload = []byte{}
	}
	if m.MessageID != "" {
		u, err := uuid.Parse(m.MessageID)
		if err != nil {
			return c, fmt.Errorf("message id %q is not a UUID: %w", m.MessageID, err)
		}
		c.messageID = pgtype.UUID{Bytes: u, Valid: true}
	}
	c.headers = []byte("{}")
	if len(m.Headers) > 0 {
		h, err := json.Marshal(m.Headers)
		if err != nil {
			return c, fmt.Errorf("headers of topic %q cannot be encoded as JSON: %w", m.Topic, err)
		}
		c.headers = h
	}
	c.contentType = nullable(m.ContentType)
	c.correlationID = nullable(m.CorrelationID)
	c.partitionKey = nullable(m.PartitionKey)
	return c, nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// arrays holds messages column by column for the unnest INSERT.
type arrays struct {
	messageID     []pgtype.UUID
	topic         []string
	payload       [][]byte
	headers       []string
	contentType   []*string
	correlationID []*string
	partitionKey  []*string
}

func (a *arrays) grow(n int) {
	a.messageID = make([]pgtype.UUID, 0, n)
	a.topic = make([]string, 0, n)
	a.payload = make([][]byte, 0, n)
	a.headers = make([]string, 0, n)
	a.contentType = make([]*string, 0, n)
	a.correlationID = make([]*string, 0, n)
	a.partitionKey = make([]*string, 0, n)
}

func (a *arrays) add(c columns) {
	a.messageID = append(a.messageID, c.messageID)
	a.topic = append(a.topic, c.topic)
	a.payload = append(a.payload, c.payload)
	a.headers = append(a.headers, string(c.headers))
	a.contentType = append(a.contentType, c.contentType)
	a.correlationID = append(a.correlationID, c.correlationID)
	a.partitionKey = append(a.partitionKey, c.partitionKey)
}
