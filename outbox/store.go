package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

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
// still moved to the history table while the sweeper stops.
const dbTimeout = 30 * time.Second

// store runs the sweeper's statements against one outbox table.
type store struct {
	pool   *pgxpool.Pool
	table  Table
	policy deadLetterPolicy
	// topicLocks is set for OrderingTopic: a batch's claim takes its topic's
	// advisory lock.
	topicLocks bool
	// idleTimeout is the page transaction's idle_in_transaction_session_timeout;
	// sendTimeout, the send timeout it is counted from.
	idleTimeout string
	sendTimeout time.Duration

	claimPageSQL      string
	moveDispatched    string
	deadLetter        string
	outstandingTopics string
	liveTopicsSQL     string
	recentDeadLetters string
	recordFailure     string
	expireSQL         string

	// progress is when a statement or a send last returned (Unix
	// nanoseconds), whatever its outcome: a live sweep moves it at least
	// once per send timeout or statement timeout (Sweeper.Stalled).
	progress atomic.Int64
}

// beat notes that a statement or a send has just returned.
func (s *store) beat() { s.progress.Store(time.Now().UnixNano()) }

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
		sendTimeout:       sendTimeout,
		claimPageSQL:      statement(t, "claim_page"),
		moveDispatched:    statement(t, "move_dispatched"),
		deadLetter:        statement(t, "dead_letter"),
		outstandingTopics: statement(t, "outstanding_topics"),
		liveTopicsSQL:     statement(t, "live_topics"),
		recentDeadLetters: statement(t, "recent_dead_letters"),
		recordFailure:     statement(t, "record_failure"),
		expireSQL:         statement(t, "expire"),
	}
}

// topics lists the topics with outstanding rows, less those in excluded.
//
// A topic name no row of this database can hold is dropped from excluded:
// one with a NUL byte (no text value can), and, when the database refuses it,
// one that is not valid UTF-8 (a UTF8 database refuses such parameters, and
// holds no such row; a topic breaker shared through Redis with a SQL_ASCII
// database can bring one in). Sent as they are, they would fail every sweep.
func (s *store) topics(ctx context.Context, excluded []string) ([]string, error) {
	excluded = slices.DeleteFunc(append([]string{}, excluded...), func(t string) bool { return strings.ContainsRune(t, 0) })
	list := func() ([]string, error) {
		rows, err := s.pool.Query(ctx, s.outstandingTopics, excluded)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[string])
	}
	defer s.beat()
	topics, err := list()
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "22021" { // character_not_in_repertoire
		excluded = slices.DeleteFunc(excluded, func(t string) bool { return !utf8.ValidString(t) })
		topics, err = list()
	}
	if err != nil {
		return nil, s.explain(err)
	}
	return topics, nil
}

// listing is what live_topics.sql found: the known topics with outstanding
// rows above their floors (live) and those with none (empty), the topics with
// outstanding rows above the discovery floor (fresh) and the highest id the
// discovery scan read (0: none), and the snapshot's xmin and xmax. When the
// scan's reread of the rows it had read before stopped at its limit, cut is
// set and reread is the highest id it read again.
type listing struct {
	live, empty, fresh []string
	last, reread       int64
	cut                bool
	xmin, xmax         uint64
}

// discoveryLimit bounds the rows each half of one listing's discovery scan
// reads (live_topics.sql).
const discoveryLimit = 100_000

// liveTopics runs live_topics.sql: it probes each of topics above its floor in
// after, and discovers the topics with outstanding rows above discovery, those
// above seen (the highest id discovery has read) apart.
func (s *store) liveTopics(ctx context.Context, topics []string, after []int64, discovery, seen int64) (listing, error) {
	defer s.beat()
	var l listing
	rows, err := s.pool.Query(ctx, s.liveTopicsSQL, topics, after, discovery, discoveryLimit, seen)
	if err != nil {
		return l, s.explain(err)
	}
	var (
		kind        int
		topic       string
		outstanding *bool
		last        *int64
	)
	_, err = pgx.ForEachRow(rows, []any{&kind, &topic, &outstanding, &last}, func() error {
		switch kind {
		case 0:
			if *outstanding {
				l.live = append(l.live, topic)
			} else {
				l.empty = append(l.empty, topic)
			}
		case 1:
			l.fresh = append(l.fresh, topic)
			l.last = max(l.last, *last)
		case 2:
			xmin, err := strconv.ParseUint(topic, 10, 64)
			if err != nil {
				return fmt.Errorf("read the snapshot's xmin %q: %w", topic, err)
			}
			l.xmin, l.xmax = xmin, uint64(*last)
		case 3:
			n, err := strconv.ParseInt(topic, 10, 64)
			if err != nil {
				return fmt.Errorf("read the count of rows discovery read again %q: %w", topic, err)
			}
			if l.cut = n >= discoveryLimit; l.cut {
				l.reread = *last
			}
		}
		return nil
	})
	if err != nil {
		return l, s.explain(err)
	}
	return l, nil
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
	if errors.As(err, &pgErr) && pgErr.Code == "42703" { // undefined_column: a schema older than this sweeper
		return fmt.Errorf("outbox table %s lacks a column this sweeper needs (its schema is older, version %d is needed): "+
			"run `sweeper migrate --schema %s --table %s` against this database: %w",
			s.table, SchemaVersion(), s.table.Schema, s.table.Name, err)
	}
	return err
}

// applied is what the store did about a failure.
type applied struct {
	// attempted says the row counted an attempt.
	attempted bool
	// deadLettered counts the rows moved to the dead-letter table, by reason,
	// with their correlation ids (for the log).
	deadLettered       int
	deadReasons        map[string]int
	deadCorrelationIDs []string
	// storm is set when the action's dead letters would have passed the storm
	// guard's limit for the topic: nothing was dead-lettered, and the topic
	// must trip.
	storm bool
	// a is the action as applied: stormed() when storm is set.
	a action
}

// apply records a failed send as the policy's action says, in the page's
// transaction. Rows it neither charges nor dead-letters stay outstanding as
// they were when the page ends (unless sent again in this page). An error is
// the page's: its transaction is rolled back at its end, and every row of the
// page is outstanding again.
func (c *claim) apply(ctx context.Context, a action, sendErr error) (applied, error) {
	out := applied{a: a}
	p, topic := c.p, c.batch.Topic
	recordCtx, cancel := stmtCtx(ctx)
	defer cancel()
	release, err := p.record()
	if err != nil {
		return out, err
	}
	defer release()
	fail := func(err error) (applied, error) {
		p.err = err
		return out, err
	}

	var named []int64
	if a.deadLetterNamed {
		named = intersect(c.batch.IDs(), producer.MessageIDs(sendErr))
		if len(named) == 0 { // a refusal of a row sent alone that names none
			named = c.batch.IDs()
		}
	}
	if a.deadLetters() {
		storm, err := p.s.stormy(recordCtx, p.tx, topic, max(len(named), 1))
		if err != nil {
			return fail(err)
		}
		if storm {
			out.storm, a = true, a.stormed()
			out.a = a
		}
	}
	if !a.attempt && !a.deadLetters() && !a.note {
		return out, nil // the page's end releases the rows
	}
	errText := truncate(sendErr.Error(), maxErrorText)
	charged := []int64{}
	if a.attempt {
		charged = c.batch.IDs()
	}
	if _, err := p.tx.Exec(recordCtx, p.s.recordFailure, c.batch.IDs(), charged, errText, a.note); err != nil {
		return fail(fmt.Errorf("record failed send of %d rows of topic %q: %w", len(c.batch.Messages), topic, err))
	}
	for _, id := range charged {
		p.attempts[id]++
	}
	out.attempted = a.attempt
	if a.deadLetterNamed {
		byReason := map[string][]int64{}
		for _, id := range named {
			r := producer.RowReason(sendErr, id)
			byReason[r] = append(byReason[r], id)
		}
		for _, r := range slices.Sorted(maps.Keys(byReason)) {
			if err := p.s.moveToDeadLetters(recordCtx, p.tx, topic, byReason[r], 0, r, errText, &out); err != nil {
				return fail(err)
			}
		}
	}
	if a.exhausted {
		if err := p.s.moveToDeadLetters(recordCtx, p.tx, topic, c.batch.IDs(), p.s.policy.maxAttempts, ReasonMaxRetriesExceeded, errText, &out); err != nil {
			return fail(err)
		}
	}
	return out, nil
}

// ReasonMaxRetriesExceeded is the dead-letter reason of a row that failed
// --max-attempts times.
const ReasonMaxRetriesExceeded = "max_retries_exceeded"

// stormy reports whether dead-lettering n more rows of topic would pass the
// storm guard's limit within its window.
func (s *store) stormy(ctx context.Context, tx *batchTx, topic string, n int) (bool, error) {
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
// the dead-letter table, noting in out what moved. topic names them in errors
// ("" for rows of several topics).
func (s *store) moveToDeadLetters(ctx context.Context, tx *batchTx, topic string, ids []int64, minAttempts int, reason, errText string, out *applied) error {
	what := fmt.Sprintf("%d rows of topic %q", len(ids), topic)
	if topic == "" {
		what = fmt.Sprintf("%d rows (%s)", len(ids), reason)
	}
	rows, err := tx.Query(ctx, s.deadLetter, ids, minAttempts, reason, errText)
	if err != nil {
		return fmt.Errorf("dead-letter %s: %w", what, err)
	}
	correlationIDs, err := pgx.CollectRows(rows, pgx.RowTo[*string])
	if err != nil {
		return fmt.Errorf("dead-letter %s: %w", what, err)
	}
	if len(correlationIDs) == 0 {
		return nil
	}
	if out.deadReasons == nil {
		out.deadReasons = map[string]int{}
	}
	out.deadLettered += len(correlationIDs)
	out.deadReasons[reason] += len(correlationIDs)
	for _, c := range correlationIDs {
		if c != nil && len(out.deadCorrelationIDs) < maxLoggedIDs {
			out.deadCorrelationIDs = append(out.deadCorrelationIDs, logText(*c))
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
