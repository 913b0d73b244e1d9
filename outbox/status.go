package outbox

import (
	"context"
	"fmt"
	"time"

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

// TableHealth is the outbox table's size and dead row versions, and what
// holds the vacuum horizon back: what an operator needs when the table grows
// or the relay slows while something else runs on the server.
type TableHealth struct {
	// Bytes is the table's size with its indexes and TOAST.
	Bytes int64 `json:"bytes"`
	// LiveRows and DeadRows are the statistics collector's estimates of its
	// live and dead row versions.
	LiveRows int64 `json:"live_rows"`
	DeadRows int64 `json:"dead_rows"`
	// LastAutovacuum is when autovacuum last finished on it; nil for never.
	LastAutovacuum *time.Time `json:"last_autovacuum"`
	// Horizon is what holds the vacuum horizon back the longest; nil when
	// nothing does.
	Horizon *HorizonHolder `json:"horizon"`
}

// HorizonHolder is a session, replication slot or prepared transaction whose
// snapshot keeps vacuum from removing the row versions deleted after it began.
type HorizonHolder struct {
	// Kind is "session", "replication slot" or "prepared transaction".
	Kind string `json:"kind"`
	// Who is the session's pid and application, the slot's or the prepared
	// transaction's name.
	Who   string `json:"who"`
	State string `json:"state"`
	// HeldSeconds is how long its transaction has been open; nil when
	// Postgres does not say (a slot, or a session of another role when the
	// sweeper's role lacks pg_read_all_stats).
	HeldSeconds *float64 `json:"held_seconds"`
	// XminAge is how many transactions ago its horizon is.
	XminAge int64 `json:"xmin_age"`
}

// Table reads the outbox table's health (table_health.sql).
func (b *Backlog) Table(ctx context.Context) (TableHealth, error) {
	return ReadTableHealth(ctx, b.pool, b.table)
}

// ReadTableHealth reads the health of t's outbox table (table_health.sql).
func ReadTableHealth(ctx context.Context, pool *pgxpool.Pool, t Table) (TableHealth, error) {
	t = t.WithDefaults()
	var (
		h                TableHealth
		kind, who, state *string
		held             *float64
		xminAge          *int64
	)
	err := pool.QueryRow(ctx, statement(t, "table_health"), pgx.Identifier{t.Schema, t.Name}.Sanitize()).Scan(
		&h.Bytes, &h.LiveRows, &h.DeadRows, &h.LastAutovacuum, &kind, &who, &state, &held, &xminAge)
	if err != nil {
		return h, fmt.Errorf("read the health of table %s: %w", t, err)
	}
	if kind != nil {
		h.Horizon = &HorizonHolder{Kind: *kind, Who: deref(who), State: deref(state), HeldSeconds: held}
		if xminAge != nil {
			h.Horizon.XminAge = *xminAge
		}
	}
	return h, nil
}
