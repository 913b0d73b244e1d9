package outbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-sweeper/sweeper/producer"
)

// IdleInTransactionTimeout is how long a batch's transaction may sit idle,
// waiting for the broker, before Postgres ends its session: sendTimeout plus
// 5s, at most Postgres's limit (about 24 days). A live sweeper never waits
// longer than a send; a frozen one loses its rows to the other sweepers after
// it, so it bounds how long a dead instance holds rows.
func IdleInTransactionTimeout(sendTimeout time.Duration) time.Duration {
	const pgMax = time.Duration(math.MaxInt32) * time.Millisecond
	return min(sendTimeout+idleMargin, pgMax)
}

// idleMargin leaves a batch's transaction time to record the outcome after a
// send that took all of its timeout.
const idleMargin = 5 * time.Second

// dbTimeout bounds each statement the sweeper runs for one batch. It is counted
// on a context detached from shutdown, so that a batch the broker has accepted is
// still marked dispatched while the sweeper stops.
const dbTimeout = 30 * time.Second

// store runs the sweeper's statements against one outbox table.
type store struct {
	pool   *pgxpool.Pool
	table  Table
	policy deadLetterPolicy
	// topicLocks is set for OrderingTopic: a batch's claim takes its topic's
	// advisory lock.
	topicLocks bool
	// idleTimeout is the batch transaction's idle_in_transaction_session_timeout.
	idleTimeout string

	claimBatch        string
	countExhausted    string
	deadLetter        string
	outstandingTopics string
	pageOutstanding   string
	recentDeadLetters string
	recordFailure     string
}

// deadLetterPolicy says when rows leave the outbox for the dead-letter table.
type deadLetterPolicy struct {
	maxAttempts int           // transient failures a row may have
	stormLimit  int           // rows of one topic dead-lettered within stormWindow
	stormWindow time.Duration // … above which the storm guard stops it
}

func newStore(pool *pgxpool.Pool, t Table, policy deadLetterPolicy, ordering Ordering, sendTimeout time.Duration) *store {
	return &store{
		pool:              pool,
		table:             t,
		policy:            policy,
		topicLocks:        ordering == OrderingTopic,
		idleTimeout:       fmt.Sprintf("%dms", IdleInTransactionTimeout(sendTimeout).Milliseconds()),
		claimBatch:        t.statement("claim_batch"),
		countExhausted:    t.statement("count_exhausted"),
		deadLetter:        t.statement("dead_letter"),
		outstandingTopics: t.statement("outstanding_topics"),
		pageOutstanding:   t.statement("page_outstanding"),
		recentDeadLetters: t.statement("recent_dead_letters"),
		recordFailure:     t.statement("record_failure"),
	}
}

// topics lists the topics with outstanding rows, less those in excluded.
func (s *store) topics(ctx context.Context, excluded []string) ([]string, error) {
	if excluded == nil {
		excluded = []string{}
	}
	rows, err := s.pool.Query(ctx, s.outstandingTopics, excluded)
	if err != nil {
		return nil, s.explain(err)
	}
	topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, s.explain(err)
	}
	return topics, nil
}

// page reads up to share outstanding rows of each of topics, each topic's after
// the id its entry in after names (0: from its first), and returns them in id
// order. It locks nothing.
func (s *store) page(ctx context.Context, topics []string, after []int64, share int) ([]producer.Message, error) {
	rows, err := s.pool.Query(ctx, s.pageOutstanding, topics, after, share)
	if err != nil {
		return nil, s.explain(err)
	}
	msgs := make([]producer.Message, 0, share*len(topics))
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
	// sent is what was claimed and handed to the producer: the whole batch,
	// nothing, or under OrderingNone the part of it that was claimable.
	sent producer.Batch
	// claimed is len(sent.Messages).
	claimed int
	// contended is set when rows of the batch were not claimable: another
	// sweeper has them in flight (or holds the topic's lock), or dispatched them
	// since the page was read. Under OrderingTopic nothing was sent then; under
	// OrderingNone only when none of the batch was claimable.
	contended bool
	// sendErr is the producer's error; nil when the batch was accepted or nothing
	// was sent.
	sendErr error
	// failed lists the rows the failure concerned: all claimed rows, or for a
	// message-class error the rows it names (which are dead-lettered). Empty on
	// success and for local failures.
	failed []int64
	// attempted says the failure counted an attempt on the claimed rows (any
	// failure but a local one, or a message-class one naming its rows).
	attempted bool
	// deadLettered counts the rows moved to the dead-letter table, with their
	// reason and correlation ids (for the log).
	deadLettered       int
	deadReason         string
	deadCorrelationIDs []string
	// storm is set when dead-lettering the named rows would pass the storm
	// guard's limit for the topic: nothing was dead-lettered, and the topic
	// must stop.
	storm bool
}

// dispatch claims the rows of b, sends them with send, and records the outcome,
// all in one short transaction.
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
// Under OrderingTopic a batch is sent whole or not at all. When part of it
// cannot be claimed, the missing rows may be in flight in another sweeper, and
// sending the rest could overtake them; the claim is rolled back and the
// outcome says contended. Under OrderingNone the claimable part is sent.
//
// send gets ctx bounded by sendTimeout; each statement gets its own dbTimeout on
// a context detached from ctx, so the outcome of a send is recorded even while
// the sweeper shuts down. The returned error is a database error: the outcome
// could not be recorded. If it comes after a successful send, the rows stay
// outstanding and will be sent again (at-least-once).
func (s *store) dispatch(ctx context.Context, b producer.Batch, sendTimeout time.Duration, send func(context.Context, producer.Batch) error) (batchOutcome, error) {
	var out batchOutcome
	stmtCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	}

	claimCtx, cancel := stmtCtx()
	defer cancel()
	tx, err := s.pool.Begin(claimCtx)
	if err != nil {
		return out, fmt.Errorf("begin batch of topic %q: %w", b.Topic, err)
	}
	defer func() {
		rollbackCtx, cancel := stmtCtx()
		defer cancel()
		_ = tx.Rollback(rollbackCtx) // a no-op after Commit
	}()

	rows, err := tx.Query(claimCtx, s.claimBatch, b.IDs(), s.topicLocks, s.table.TopicLockKey(b.Topic), s.idleTimeout)
	if err != nil {
		return out, fmt.Errorf("claim batch of topic %q, %d rows: %w", b.Topic, len(b.Messages), err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return out, fmt.Errorf("claim batch of topic %q, %d rows: %w", b.Topic, len(b.Messages), err)
	}
	if len(claimed) < len(b.Messages) {
		out.contended = true
		if s.topicLocks || len(claimed) == 0 {
			return out, nil
		}
		slices.Sort(claimed)
		b = subset(b, claimed)
	}
	out.sent, out.claimed = b, len(claimed)

	sendCtx, cancelSend := context.WithTimeout(ctx, sendTimeout)
	out.sendErr = send(sendCtx, b)
	if out.sendErr != nil && sendCtx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
		out.sendErr = fmt.Errorf("send of %d messages timed out after %s (--send-timeout): %w", len(b.Messages), sendTimeout, out.sendErr)
	}
	cancelSend()

	recordCtx, cancel := stmtCtx()
	defer cancel()
	if out.sendErr == nil {
		if err := tx.Commit(recordCtx); err != nil {
			return out, fmt.Errorf("commit %d sent rows of topic %q as dispatched (they will be sent again): %w", len(claimed), b.Topic, err)
		}
		return out, nil
	}

	errText := truncate(out.sendErr.Error(), maxErrorText)
	out.failed = claimed
	class := producer.ClassOf(out.sendErr)
	switch class {
	case producer.ClassLocal:
		// Not the rows' fault: the rollback leaves them as they were.
		out.failed = nil
		return out, nil
	case producer.ClassMessage:
		// The rows the error names leave the outbox now, with the producer's
		// reason; their neighbours were not rejected, merely not sent. An error
		// that names none of the batch's rows cannot be pinned on one: it counts
		// as an attempt of every row, as a transient failure does.
		if named := intersect(claimed, producer.MessageIDs(out.sendErr)); len(named) > 0 {
			out.failed = named
			if err := s.deadLetterNamed(recordCtx, tx, b.Topic, claimed, named, out.sendErr, errText, &out); err != nil {
				return out, err
			}
			if err := tx.Commit(recordCtx); err != nil {
				return out, fmt.Errorf("dead-letter %d rows of topic %q: %w", len(named), b.Topic, err)
			}
			return out, nil
		}
		class = producer.ClassTransient
	}
	if _, err := tx.Exec(recordCtx, s.recordFailure, claimed, out.failed, errText); err != nil {
		return out, fmt.Errorf("record failed send of %d rows of topic %q: %w", len(claimed), b.Topic, err)
	}
	out.attempted = true
	if class == producer.ClassTransient && s.policy.maxAttempts > 0 {
		// Rows that have now failed --max-attempts times leave the outbox,
		// within the storm guard. Topic-class failures never dead-letter: the
		// topic breaker deals with the topic, and its rows are good.
		var exhausted int
		if err := tx.QueryRow(recordCtx, s.countExhausted, claimed, s.policy.maxAttempts).Scan(&exhausted); err != nil {
			return out, fmt.Errorf("count exhausted rows of topic %q: %w", b.Topic, err)
		}
		if exhausted > 0 {
			if out.storm, err = s.stormy(recordCtx, tx, b.Topic, exhausted); err != nil {
				return out, err
			}
			if !out.storm {
				if err := s.moveToDeadLetters(recordCtx, tx, b.Topic, claimed, s.policy.maxAttempts, ReasonMaxRetriesExceeded, errText, &out); err != nil {
					return out, err
				}
			}
		}
	}
	if err := tx.Commit(recordCtx); err != nil {
		return out, fmt.Errorf("record failed send of %d rows of topic %q: %w", len(claimed), b.Topic, err)
	}
	return out, nil
}

// ReasonMaxRetriesExceeded is the dead-letter reason of a row that failed
// --max-attempts times.
const ReasonMaxRetriesExceeded = "max_retries_exceeded"

// deadLetterNamed moves the rows a message-class error named to the dead-letter
// table, unless that would pass the storm guard's limit for the topic: then it
// moves none, and sets out.storm. The other claimed rows go back to outstanding
// either way, with no attempt counted.
func (s *store) deadLetterNamed(ctx context.Context, tx pgx.Tx, topic string, claimed, named []int64, sendErr error, errText string, out *batchOutcome) (err error) {
	if _, err := tx.Exec(ctx, s.recordFailure, claimed, []int64{}, errText); err != nil {
		return fmt.Errorf("release %d rows of topic %q: %w", len(claimed), topic, err)
	}
	if out.storm, err = s.stormy(ctx, tx, topic, len(named)); err != nil || out.storm {
		return err
	}
	reason := producer.ReasonOf(sendErr)
	if reason == "" {
		reason = producer.ReasonInvalidMessage
	}
	return s.moveToDeadLetters(ctx, tx, topic, named, 0, reason, errText, out)
}

// stormy reports whether dead-lettering n more rows of topic would pass the
// storm guard's limit within its window.
func (s *store) stormy(ctx context.Context, tx pgx.Tx, topic string, n int) (bool, error) {
	if s.policy.stormLimit <= 0 {
		return false, nil
	}
	var recent int
	if err := tx.QueryRow(ctx, s.recentDeadLetters, topic, s.policy.stormWindow).Scan(&recent); err != nil {
		return false, fmt.Errorf("count recent dead letters of topic %q: %w", topic, err)
	}
	return recent+n > s.policy.stormLimit, nil
}

// moveToDeadLetters moves the rows of ids with at least minAttempts attempts to
// the dead-letter table, noting in out what moved.
func (s *store) moveToDeadLetters(ctx context.Context, tx pgx.Tx, topic string, ids []int64, minAttempts int, reason, errText string, out *batchOutcome) error {
	rows, err := tx.Query(ctx, s.deadLetter, ids, minAttempts, reason, errText)
	if err != nil {
		return fmt.Errorf("dead-letter rows of topic %q: %w", topic, err)
	}
	correlationIDs, err := pgx.CollectRows(rows, pgx.RowTo[*string])
	if err != nil {
		return fmt.Errorf("dead-letter rows of topic %q: %w", topic, err)
	}
	out.deadLettered, out.deadReason = len(correlationIDs), reason
	for _, c := range correlationIDs {
		if c != nil && len(out.deadCorrelationIDs) < maxLoggedIDs {
			out.deadCorrelationIDs = append(out.deadCorrelationIDs, *c)
		}
	}
	return nil
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

// without returns b less the rows whose ids are in ids.
func without(b producer.Batch, ids []int64) producer.Batch {
	drop := make(map[int64]bool, len(ids))
	for _, id := range ids {
		drop[id] = true
	}
	out := producer.Batch{Topic: b.Topic}
	for _, m := range b.Messages {
		if !drop[m.ID] {
			out.Messages = append(out.Messages, m)
		}
	}
	return out
}

// intersect returns the ids of a that are also in b, never nil (pgx would send a
// nil slice as NULL).
func intersect(a, b []int64) []int64 {
	in := make(map[int64]bool, len(b))
	for _, id := range b {
		in[id] = true
	}
	out := []int64{}
	for _, id := range a {
		if in[id] {
			out = append(out, id)
		}
	}
	return out
}
