package outbox

import (
	"context"
	"errors"
	"fmt"
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

// IdleInTransactionTimeout is how long a page's transaction may sit idle,
// waiting for the broker, before Postgres ends its session: sendTimeout plus
// 5s, at most Postgres's limit (about 24 days). A live sweeper never waits
// longer than a send; a frozen one loses its rows to the other sweepers after
// it, so it bounds how long a dead instance holds rows.
func IdleInTransactionTimeout(sendTimeout time.Duration) time.Duration {
	const pgMax = time.Duration(math.MaxInt32) * time.Millisecond
	return min(sendTimeout+idleMargin, pgMax)
}

// idleMargin leaves a page's transaction time to record the outcome after a
// send that took all of its timeout.
const idleMargin = 5 * time.Second

// dbTimeout bounds each statement the sweeper runs for a page. It is counted
// on a context detached from shutdown, so that a page's rows the broker has
// accepted are still moved to the history table while the sweeper stops.
const dbTimeout = 30 * time.Second

// store runs the sweeper's statements against one outbox table that run
// outside a page's transaction (topic lists, expire.sql), and holds what a
// page needs of the table (page.go runs the page's own).
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

	// pageSQL is the statements a page runs in its transaction; only the
	// page (page.go, page_outcome.go) reads them.
	pageSQL           pageStatements
	outstandingTopics string
	liveTopicsSQL     string
	// discoveryLimit is discoveryLimit, a field so that tests can shrink it.
	discoveryLimit int
	belowFloorsSQL string
	nonPositiveSQL string
	expireSQL      string

	// progress is the sweeper's heartbeat, shared with it: every statement
	// beats it as it returns.
	progress *heartbeat
}

// beat notes that a statement has just returned.
func (s *store) beat() { s.progress.beat() }

// heartbeat is when a statement or a send last returned (Unix nanoseconds),
// whatever its outcome: a live sweep moves it at least once per send timeout
// or statement timeout (Sweeper.Stalled). The store beats it for statements
// and the topic sender for sends, each without the other.
type heartbeat struct{ at atomic.Int64 }

func (h *heartbeat) beat() { h.at.Store(time.Now().UnixNano()) }

func (h *heartbeat) last() int64 { return h.at.Load() }

// deadLetterPolicy says when rows leave the outbox for the dead-letter table.
type deadLetterPolicy struct {
	maxAttempts int           // transient failures a row may have
	stormLimit  int           // rows of one topic dead-lettered within stormWindow
	stormWindow time.Duration // … above which the storm guard stops it
}

func newStore(pool *pgxpool.Pool, t Table, policy deadLetterPolicy, ordering Ordering, sendTimeout time.Duration, progress *heartbeat) *store {
	return &store{
		progress:          progress,
		pool:              pool,
		table:             t,
		policy:            policy,
		topicLocks:        ordering == OrderingTopic,
		idleTimeout:       fmt.Sprintf("%dms", IdleInTransactionTimeout(sendTimeout).Milliseconds()),
		sendTimeout:       sendTimeout,
		pageSQL:           newPageStatements(t),
		outstandingTopics: statement(t, "outstanding_topics"),
		liveTopicsSQL:     statement(t, "live_topics"),
		discoveryLimit:    discoveryLimit,
		belowFloorsSQL:    statement(t, "below_floors"),
		nonPositiveSQL:    statement(t, "dead_letter_nonpositive"),
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
	// Under the page's planner settings (queryPlanned): statistics that read
	// a backlog as a few rows could otherwise have each of the skip scan's
	// seeks read the table whole.
	list := func() ([]string, error) {
		var topics []string
		err := queryPlanned(ctx, s.pool, func(rows pgx.Rows) error {
			var err error
			topics, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		}, s.outstandingTopics, excluded)
		return topics, err
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
// discovery scan read (0: none), and the snapshot's xmin and xmax; first
// holds each live known topic's first outstanding id. When the
// scan's reread of the rows it had read before stopped at its limit, cut is
// set and reread is the highest id it read again.
type listing struct {
	live, empty, fresh []string
	last, reread       int64
	first              map[string]int64
	cut                bool
	xmin, xmax         uint64
}

// discoveryLimit bounds the rows each half of one listing's discovery scan
// reads (live_topics.sql).
const discoveryLimit = 100_000

// liveTopics runs live_topics.sql: it probes each of topics above its floor in
// after, and discovers the topics with outstanding rows above discovery, those
// above seen (the highest id discovery has read) apart. Without reread the
// rows between discovery and seen are not read again (cursor.rereadDue).
func (s *store) liveTopics(ctx context.Context, topics []string, after []int64, discovery, seen int64, reread bool) (listing, error) {
	if !reread {
		discovery = max(discovery, seen) // the first half of the discovery scan reads nothing
	}
	defer s.beat()
	var l listing
	var (
		kind        int
		topic       string
		outstanding *bool
		last        *int64
	)
	// The listing reads under the page's planner settings (queryPlanned): with
	// the statistics of a held horizon the planner read each topic's probe by a
	// sequential scan, then by a full index scan and a sort (issue 32's soak).
	scan := func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&kind, &topic, &outstanding, &last}, func() error {
			switch kind {
			case 0:
				if *outstanding {
					l.live = append(l.live, topic)
					if l.first == nil {
						l.first = map[string]int64{}
					}
					l.first[topic] = *last
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
				if l.cut = n >= int64(s.discoveryLimit); l.cut {
					l.reread = *last
				}
			}
			return nil
		})
		return err
	}
	if err := queryPlanned(ctx, s.pool, scan, s.liveTopicsSQL, topics, after, discovery, s.discoveryLimit, seen); err != nil {
		return listing{}, s.explain(err)
	}
	return l, nil
}

// ReasonInvalidID is the dead-letter reason of a row written with an id of 0
// or less, which the sweeper would never send (dead_letter_nonpositive.sql).
const ReasonInvalidID = "invalid_id"

// deadLetterNonPositive moves up to limit outstanding rows whose id is not
// positive to the dead-letter table (dead_letter_nonpositive.sql) and returns
// their topics.
func (s *store) deadLetterNonPositive(ctx context.Context, limit int) ([]string, error) {
	rows, err := s.pool.Query(ctx, s.nonPositiveSQL, limit)
	if err != nil {
		return nil, s.explain(err)
	}
	topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, s.explain(err)
	}
	return topics, nil
}

// belowFloors reports whether an outstanding row lies at or below the
// cursor's floors (below_floors.sql): topics and floors are the members', and
// discovery the discovery floor.
func (s *store) belowFloors(ctx context.Context, topics []string, floors []int64, discovery int64) (bool, error) {
	var below bool
	scan := func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&below}, func() error { return nil })
		return err
	}
	if err := queryPlanned(ctx, s.pool, scan, s.belowFloorsSQL, topics, floors, discovery); err != nil {
		return false, s.explain(err)
	}
	return below, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// gone reports whether err, a statement's that the server refused, came as
// the outbox table went: the table is not there now (to_regclass, which
// asks the catalog as of now). A drop fails the statements after it with
// undefined_table, and one that runs beside it now and then with a
// deadlock (DROP SCHEMA … CASCADE locks the tables in its own order). A
// missing dead-letter or history table, a connection lost, or a failed
// look is an ordinary failure: false.
func (s *store) gone(ctx context.Context, err error) bool {
	if !serverRefused(err) {
		return false
	}
	// Not ctx's end: the host may be stopping the sweeper for the very
	// drop, and a look cut short would log its failure as an error.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var missing bool
	if err := s.pool.QueryRow(qctx, "SELECT to_regclass($1) IS NULL", s.table.Ident()).Scan(&missing); err != nil {
		return false
	}
	return missing
}

// serverRefused reports whether err is a statement's error that the server
// returned, not a connection's.
func serverRefused(err error) bool {
	_, ok := errors.AsType[*pgconn.PgError](err)
	return ok
}

// findHistory returns an error wrapping ErrNoHistory, saying what to do,
// when the history table the page's moves write to does not exist, and says
// whether it found it. Without the outbox table either it reports nothing:
// the sweep's first statement fails on that, as it always has (explain; a
// host's dropped tenant).
func (s *store) findHistory(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	var found, outbox bool
	if err := s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL",
		HistoryIdent(s.table), s.table.Ident()).Scan(&found, &outbox); err != nil {
		return false, fmt.Errorf("look for the history table of %s: %w", s.table, err)
	}
	if !found && outbox {
		return false, fmt.Errorf("%w: %s does not exist (schema version 10 makes it), so no row could be recorded as sent and none is sent: "+
			"run `sweeper migrate --schema %s --table %s` against this database", ErrNoHistory, HistoryIdent(s.table), s.table.Schema, s.table.Name)
	}
	return found, nil
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

// bloat the table.
const maxErrorText = 2000

// dbText makes s, an error's text or a reason that a producer, a broker or a
// row composed, fit to write into a text column: invalid UTF-8 and NUL bytes
// become U+FFFD, and it is cut to maxErrorText. Postgres refuses either in a
// text parameter (SQLSTATE 22021), and the refusal of a page's last_error or
// dead-letter reason rolled back the page, every batch the broker had taken
// in it with it: they were sent again at every sweep, and the failing row
// never counted its attempt (an independent review, 2026-11-29).
func dbText(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	return truncate(s, maxErrorText)
}

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
