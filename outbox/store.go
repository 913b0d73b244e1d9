package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-sweeper/sweeper/producer"
	outboxsql "github.com/outbox-sweeper/sweeper/sql"
)

// dbTimeout bounds each statement the sweeper runs for one batch. It is counted
// on a context detached from shutdown, so that a batch the broker has accepted is
// still marked dispatched while the sweeper stops.
const dbTimeout = 30 * time.Second

// store runs the sweeper's statements against one outbox table.
type store struct {
	pool  *pgxpool.Pool
	table Table

	claimBatch      string
	pageOutstanding string
	recordFailure   string
}

func newStore(pool *pgxpool.Pool, t Table) *store {
	stmt := func(name string) string { return outboxsql.Statement(name, t.ident(), t.deadLetterIdent()) }
	return &store{
		pool:            pool,
		table:           t,
		claimBatch:      stmt("claim_batch"),
		pageOutstanding: stmt("page_outstanding"),
		recordFailure:   stmt("record_failure"),
	}
}

// page reads up to limit outstanding rows with ids above after, in id order,
// leaving out the topics in skip. It locks nothing.
func (s *store) page(ctx context.Context, limit int, skip []string, after int64) ([]producer.Message, error) {
	if skip == nil {
		skip = []string{}
	}
	rows, err := s.pool.Query(ctx, s.pageOutstanding, limit, skip, after)
	if err != nil {
		return nil, s.explain(err)
	}
	msgs := make([]producer.Message, 0, limit)
	var (
		contentType, correlationID, partitionKey *string
		m                                        producer.Message
	)
	_, err = pgx.ForEachRow(rows, []any{&m.ID, &m.MessageID, &m.Topic, &m.Payload, &m.Headers,
		&contentType, &correlationID, &partitionKey, &m.CreatedAt, &m.Attempts}, func() error {
		m.ContentType, m.CorrelationID, m.PartitionKey = deref(contentType), deref(correlationID), deref(partitionKey)
		msgs = append(msgs, m)
		m = producer.Message{} // Payload and Headers must not share memory with the next row.
		return nil
	})
	if err != nil {
		return nil, s.explain(err)
	}
	return msgs, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// explain adds what to do to errors an operator can fix.
func (s *store) explain(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("outbox table %s does not exist: run `sweeper migrate --schema %s --table %s` against this database: %w",
			s.table, s.table.Schema, s.table.Name, err)
	}
	return err
}

// batchOutcome is what became of one batch.
type batchOutcome struct {
	// claimed is how many of the batch's rows this sweeper locked; the others were
	// in flight in another sweeper or dispatched since the page was read.
	claimed int
	// sendErr is the producer's error; nil when the batch was accepted or nothing
	// was claimed.
	sendErr error
}

// dispatch claims the rows of b, sends the claimed ones with send, and records
// the outcome, all in one short transaction.
//
// Why a transaction that holds row locks across the network call, rather than a
// claim column with a lease: the lock is the claim. A second sweeper's claim
// skips locked rows (SKIP LOCKED), so it never sends a row this one has in
// flight; if this process dies mid-send, Postgres ends the session and rolls the
// transaction back at once, so no lease has to run out before another sweeper may
// take the rows; and the claim costs no write beyond the mark itself. The claim
// marks the rows dispatched in the same statement, so a successful batch costs
// three round trips (begin, claim, commit); the mark counts only once the commit
// follows the broker's acceptance. The price is one pooled connection per batch
// in flight, which --concurrency bounds.
//
// The returned error is a database error: the outcome could not be recorded. If
// it comes after a successful send, the rows stay outstanding and will be sent
// again (at-least-once).
func (s *store) dispatch(ctx context.Context, b producer.Batch, send func(context.Context, producer.Batch) error) (batchOutcome, error) {
	var out batchOutcome
	dbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()

	tx, err := s.pool.Begin(dbCtx)
	if err != nil {
		return out, fmt.Errorf("begin batch of topic %q: %w", b.Topic, err)
	}
	defer func() { _ = tx.Rollback(dbCtx) }() // no-op after Commit

	rows, err := tx.Query(dbCtx, s.claimBatch, b.IDs())
	if err != nil {
		return out, fmt.Errorf("claim batch of topic %q, %d rows: %w", b.Topic, len(b.Messages), err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return out, fmt.Errorf("claim batch of topic %q, %d rows: %w", b.Topic, len(b.Messages), err)
	}
	out.claimed = len(claimed)
	if len(claimed) == 0 {
		return out, nil
	}
	if len(claimed) < len(b.Messages) {
		slices.Sort(claimed)
		b = subset(b, claimed)
	}

	out.sendErr = send(ctx, b)
	if out.sendErr == nil {
		if err := tx.Commit(dbCtx); err != nil {
			return out, fmt.Errorf("commit %d sent rows of topic %q as dispatched (they will be sent again): %w", len(claimed), b.Topic, err)
		}
		return out, nil
	}

	failed := claimed
	switch producer.ClassOf(out.sendErr) {
	case producer.ClassLocal:
		// Not the rows' fault: the rollback leaves them as they were.
		return out, nil
	case producer.ClassMessage:
		// Only the rows the error names count an attempt; their neighbours were
		// not rejected, merely not sent.
		failed = intersect(claimed, producer.MessageIDs(out.sendErr))
	}
	if _, err := tx.Exec(dbCtx, s.recordFailure, claimed, failed, truncate(out.sendErr.Error(), maxErrorText)); err != nil {
		return out, fmt.Errorf("record failed send of %d rows of topic %q: %w", len(claimed), b.Topic, err)
	}
	if err := tx.Commit(dbCtx); err != nil {
		return out, fmt.Errorf("record failed send of %d rows of topic %q: %w", len(claimed), b.Topic, err)
	}
	return out, nil
}

// maxErrorText bounds last_error, so a broker that returns a page of HTML cannot
// bloat the table.
const maxErrorText = 2000

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut at a rune boundary so the text stays valid UTF-8 for Postgres.
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

// subset returns the messages of b whose ids are in ids, both in ascending order.
func subset(b producer.Batch, ids []int64) producer.Batch {
	out := producer.Batch{Topic: b.Topic, Messages: make([]producer.Message, 0, len(ids))}
	j := 0
	for _, m := range b.Messages {
		for j < len(ids) && ids[j] < m.ID {
			j++
		}
		if j < len(ids) && ids[j] == m.ID {
			out.Messages = append(out.Messages, m)
		}
	}
	return out
}

// intersect returns the ids of a that are also in b.
func intersect(a, b []int64) []int64 {
	in := make(map[int64]bool, len(b))
	for _, id := range b {
		in[id] = true
	}
	var out []int64
	for _, id := range a {
		if in[id] {
			out = append(out, id)
		}
	}
	return out
}
