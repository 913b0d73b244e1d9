package writer

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// SQLDB is what [Writer.WriteSQL] needs of a database/sql handle: *sql.Tx,
// *sql.DB and *sql.Conn satisfy it, and so do sqlx's and Bun's transactions.
// Pass the transaction that makes the business change. Any Postgres driver
// serves (pgx's stdlib, lib/pq): the messages travel as one text parameter.
type SQLDB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// jsonMessage is one message as insert_messages_json.sql reads it.
type jsonMessage struct {
	MessageID     string          `json:"message_id,omitempty"`
	Topic         string          `json:"topic"`
	Payload       []byte          `json:"payload"` // base64
	Headers       json.RawMessage `json:"headers"`
	ContentType   *string         `json:"content_type"`
	CorrelationID *string         `json:"correlation_id"`
	PartitionKey  *string         `json:"partition_key"`
	ExpiresAt     *time.Time      `json:"expires_at,omitempty"`
}

// WriteSQL is [Writer.Write] for database/sql: it inserts msgs through db in
// one statement, so one round trip, whatever their number (there is no COPY
// in database/sql; a multi-row INSERT of 10,000 messages is still one
// statement). Ids ascend in the order of msgs. An invalid message fails the
// call before anything is sent, naming it; so does text that is not UTF-8
// (JSON, which carries the messages, cannot hold it; Write would store it
// in a SQL_ASCII database). A message id the outbox holds fails the call
// with a [*DuplicateMessageIDError] when the driver returns Postgres's
// error as pgx does (its stdlib driver); other drivers' errors are returned
// wrapped, as they come.
func (w *Writer) WriteSQL(ctx context.Context, db SQLDB, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	msgs = w.withContext(ctx, msgs)
	doc, err := w.encodeJSON(msgs)
	if err != nil {
		return err
	}
	return w.insertSQL(ctx, db, doc, msgs)
}

// WriteOrderedSQL is [Writer.WriteOrdered] for database/sql: tx must be the
// business change's transaction (*sql.Tx, or a library's transaction over
// it), since the topic locks it takes end with that transaction.
func (w *Writer) WriteOrderedSQL(ctx context.Context, tx SQLDB, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	msgs = w.withContext(ctx, msgs)
	doc, err := w.encodeJSON(msgs) // checks every message before any lock
	if err != nil {
		return err
	}
	names, keys, err := w.orderedKeys(msgs)
	if err != nil {
		return err
	}
	lockDoc, err := json.Marshal(keys)
	if err == nil {
		_, err = tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) FROM jsonb_array_elements_text($1::text::jsonb) AS k",
			string(lockDoc))
	}
	if err != nil {
		return fmt.Errorf("lock outbox topics %q of %s for ordered writes: %w", names, w.table, err)
	}
	return w.insertSQL(ctx, tx, doc, msgs)
}

func (w *Writer) insertSQL(ctx context.Context, db SQLDB, doc string, msgs []Message) error {
	stmt := w.insertJSON
	if slices.ContainsFunc(msgs, func(m Message) bool { return !m.ExpiresAt.IsZero() }) {
		stmt = w.insertJSONExpiring
	}
	if _, err := db.ExecContext(ctx, stmt, doc); err != nil {
		if dup := w.duplicate(err, msgs); dup != nil {
			return dup
		}
		return fmt.Errorf("insert %d outbox messages into %s: %w", len(msgs), w.table, err)
	}
	return nil
}

// encodeJSON checks msgs as Write does and encodes them for
// insert_messages_json.sql.
func (w *Writer) encodeJSON(msgs []Message) (string, error) {
	rows := make([]jsonMessage, len(msgs))
	cols := make([]columns, len(msgs))
	for i := range msgs {
		c, err := toColumns(&msgs[i])
		if err != nil {
			return "", fmt.Errorf("outbox message %d of %d: %w", i+1, len(msgs), err)
		}
		cols[i] = c
		r := jsonMessage{Topic: c.topic, Payload: c.payload, Headers: c.headers, ContentType: c.contentType,
			CorrelationID: c.correlationID, PartitionKey: c.partitionKey, ExpiresAt: c.expiresAt}
		if c.messageID.Valid {
			r.MessageID = uuidString(c.messageID.Bytes)
		}
		rows[i] = r
	}
	if i, j := repeatedMessageID(cols); j >= 0 {
		return "", &DuplicateMessageIDError{MessageID: uuidString(cols[j].messageID.Bytes), Positions: []int{i + 1, j + 1},
			Table: w.table.String(), Total: len(msgs)}
	}
	doc, err := json.Marshal(rows)
	if err != nil {
		return "", fmt.Errorf("encode %d outbox messages for %s: %w", len(msgs), w.table, err)
	}
	return string(doc), nil
}

// orderedKeys returns the advisory lock keys of msgs' topics, in byte order of
// the topics so that two writers cannot deadlock on them.
func (w *Writer) orderedKeys(msgs []Message) (names, keys []string, err error) {
	names = make([]string, 0, 1)
	for i, m := range msgs {
		if m.Topic == "" {
			return nil, nil, fmt.Errorf("outbox message %d of %d: topic is empty: every message needs a destination", i+1, len(msgs))
		}
		names = append(names, m.Topic)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	keys = make([]string, len(names))
	for i, n := range names {
		keys[i] = "outbox-writer " + w.table.String() + " " + n
	}
	return names, keys, nil
}
