package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Backlog reads what waits in an outbox and its dead-letter table, for an
// operator's overview (the admin API's GET /status).
type Backlog struct {
	pool        *pgxpool.Pool
	table       Table
	byTopic     string
	deadLetters string
}

// TopicBacklog is what waits of one topic.
type TopicBacklog struct {
	Topic       string
	Outstanding int64
	// OldestAgeSeconds is how long ago its oldest outstanding row was
	// written.
	OldestAgeSeconds float64
}

// DeadLetterGroup counts the dead letters of one topic and reason.
type DeadLetterGroup struct {
	Topic            string  `json:"topic"`
	Reason           string  `json:"reason"`
	Count            int64   `json:"count"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
}

// NewBacklog returns a reader of t's backlog.
func NewBacklog(pool *pgxpool.Pool, t Table) (*Backlog, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &Backlog{pool: pool, table: t, byTopic: statement(t, "backlog_by_topic"), deadLetters: statement(t, "dead_letter_summary")}, nil
}

// Topics returns each topic with outstanding rows, by name. It reads every
// outstanding row's index entry: its cost grows with the backlog.
func (b *Backlog) Topics(ctx context.Context) ([]TopicBacklog, error) {
	rows, err := b.pool.Query(ctx, b.byTopic)
	if err != nil {
		return nil, fmt.Errorf("read the backlog of %s by topic: %w", b.table, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TopicBacklog, error) {
		var t TopicBacklog
		return t, r.Scan(&t.Topic, &t.Outstanding, &t.OldestAgeSeconds)
	})
	if err != nil {
		return nil, fmt.Errorf("read the backlog of %s by topic: %w", b.table, err)
	}
	return out, nil
}

// DeadLetters returns the dead letters counted by topic and reason.
func (b *Backlog) DeadLetters(ctx context.Context) ([]DeadLetterGroup, error) {
	rows, err := b.pool.Query(ctx, b.deadLetters)
	if err != nil {
		return nil, fmt.Errorf("count the dead letters of %s: %w", b.table, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetterGroup, error) {
		var g DeadLetterGroup
		return g, r.Scan(&g.Topic, &g.Reason, &g.Count, &g.OldestAgeSeconds)
	})
	if err != nil {
		return nil, fmt.Errorf("count the dead letters of %s: %w", b.table, err)
	}
	return out, nil
}
