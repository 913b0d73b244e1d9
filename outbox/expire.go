package outbox

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-sweeper/sweeper/producer"
)

// ReasonExpired is the dead-letter reason of a row that passed its deadline
// (its expires_at, or its topic's max age counted from created_at) before it
// could be sent.
const ReasonExpired = "expired"

// ExpiryObserver is an Observer that also wants to count expired rows (the
// metrics package implements it). Expired rows are dead letters too: they are
// reported to DeadLettered as well.
type ExpiryObserver interface {
	Observer
	// Expired reports n rows of topic moved to the dead-letter table with
	// reason expired.
	Expired(topic string, n int)
}

// maxAge returns topic's max age, zero for none.
func (c *Config) maxAge(topic string) time.Duration {
	if d, ok := c.TopicMaxAge[topic]; ok {
		return max(d, 0) // negative: never, whatever MaxAge says
	}
	return c.MaxAge
}

// expiresByAge says whether any topic may have a max age.
func (c *Config) expiresByAge() bool {
	if c.MaxAge > 0 {
		return true
	}
	for _, d := range c.TopicMaxAge {
		if d > 0 {
			return true
		}
	}
	return false
}

// expiredWhy says why m may not be sent at now: its own deadline passed, or it
// is older than its topic's max age; "" if neither. The sweeper's clock judges
// both (created_at and expires_at are the database's: keep the clocks in
// step, as for any timestamp).
//
// The max age is asked first: a message's ExpiresAt may be its max age's
// deadline, when that comes first (deadline).
func (s *Sweeper) expiredWhy(m *producer.Message, now time.Time) string {
	if age := s.cfg.maxAge(m.Topic); age > 0 && now.Sub(m.CreatedAt) >= age {
		return ageError(age)
	}
	if !m.ExpiresAt.IsZero() && !now.Before(m.ExpiresAt) {
		return "its expires_at passed before it could be sent"
	}
	return ""
}

// deadline sets each message's ExpiresAt to the earlier of the row's own
// and its topic's max age counted from its CreatedAt, so that a producer
// whose broker has a per-message time to live (RabbitMQ, Service Bus)
// passes on the time left, whichever deadline it is.
func (s *Sweeper) deadline(msgs []producer.Message) {
	if !s.cfg.expiresByAge() {
		return // the rows' own deadlines stand as they are
	}
	for i := range msgs {
		m := &msgs[i]
		if age := s.cfg.maxAge(m.Topic); age > 0 {
			if d := m.CreatedAt.Add(age); m.ExpiresAt.IsZero() || d.Before(m.ExpiresAt) {
				m.ExpiresAt = d
			}
		}
	}
}

func ageError(age time.Duration) string {
	return fmt.Sprintf("it passed the max age of its topic (%s, counted from created_at) before it could be sent", age)
}

// expireRows moves the rows of msgs, claimed in the page st.page, that can
// never be sent to the dead-letter table (page.expire), and reports them. It
// returns the others in their order, and what moved. It runs as a page is
// sent and again before each batch is handed to the producer, so a row that
// expires while its batch waits its turn is not sent either (a send the
// producer retries within --send-timeout may still end up to that late). A
// row that moves holds up none behind it. A database error is the page's.
func (s *Sweeper) expireRows(st *sweepState, msgs []producer.Message) ([]producer.Message, outcome, error) {
	now := time.Now()
	gone, unreadable, err := st.page.expire(st.work, msgs, func(m *producer.Message) string { return s.expiredWhy(m, now) })
	if err != nil {
		return nil, outcome{}, err
	}
	if gone == nil {
		return msgs, outcome{}, nil
	}
	kept := make([]producer.Message, 0, len(msgs)-len(gone))
	moved := outcome{expiredRows: expiredTally{}}
	for _, m := range msgs {
		switch gone[m.ID] {
		case "":
			kept = append(kept, m)
		case ReasonExpired:
			moved.expiredRows.add(m.Topic, m.CorrelationID)
			moved.expired++
			moved.deadLettered++
		default:
			moved.unreadable = append(moved.unreadable, unreadableRow{m, unreadable[m.ID]})
			moved.deadLettered++
		}
	}
	s.report(moved)
	return kept, moved, nil
}

// expireLeftOut moves the rows that no page of this sweep will claim and that
// are past their deadline to the dead-letter table (expire.sql): by age, those
// of the topics left out of paging (tripped, cooling down, backing off), or of
// every topic with every set (the broker's breaker is open); by their own
// expires_at, those of every topic. It runs once per tick, a statement at a
// time, until nothing more expires or the tick's time is up. Only a failure
// to list the topics is returned.
//
// every is a flag of its own, not a nil leftOut: a sweep that left no topic
// out passes nil too, and listed every topic and ran their expiry at each
// tick (an independent review, 2026-11-29).
func (s *Sweeper) expireLeftOut(ctx context.Context, leftOut []string, every bool, due time.Time, res *SweepResult) error {
	var topics []string
	var ages []int64
	var whys []string
	if s.cfg.expiresByAge() {
		if every {
			all, err := s.store.topics(ctx, nil)
			if err != nil {
				return fmt.Errorf("list topics with outstanding rows in %s to expire their old rows: %w", s.cfg.Table, err)
			}
			leftOut = all
		}
		// A topic may be left out twice (tripped and backing off), and a
		// topic name no row can hold (a NUL byte, invalid UTF-8: brought in
		// by a shared breaker) would fail the statement: neither goes in.
		seen := map[string]bool{}
		for _, t := range leftOut {
			if seen[t] || strings.ContainsRune(t, 0) || !utf8.ValidString(t) {
				continue
			}
			seen[t] = true
			if age := s.cfg.maxAge(t); age > 0 {
				topics, ages, whys = append(topics, t), append(ages, age.Milliseconds()), append(whys, ageError(age))
			}
		}
	}
	for range maxExpireRounds {
		moved, err := s.store.expire(ctx, topics, ages, whys, s.cfg.PageSize)
		if err != nil {
			// Logged, not the sweep's error: a pass that fails must not stop
			// the topics that send. A database that is down fails the sweep
			// anyway, at its next statement. A table dropped from under a host
			// of many fails it too, and the sweep's failure says so.
			if s.dropped(ctx, err) {
				return nil
			}
			s.logger.Error("expiring rows past their deadline failed; they will be tried at the next tick, and rows a page claims are still checked",
				"table", s.cfg.Table.String(), "err", err)
			return nil
		}
		n := moved.total()
		o := outcome{expiredRows: moved, deadLettered: n, expired: n}
		s.report(o)
		res.add(o)
		if n == 0 || (!due.IsZero() && !time.Now().Before(due)) {
			return nil
		}
	}
	return nil
}

// maxExpireRounds bounds the statements one tick's expireLeftOut runs, each
// moving up to a page of rows by age and a page by expires_at.
const maxExpireRounds = 20

// expire runs expire.sql once and returns what moved, per topic. Nil slices
// go as NULL arrays, which unnest as no topic.
func (s *store) expire(ctx context.Context, topics []string, ages []int64, whys []string, limit int) (expiredTally, error) {
	ctx, cancel := stmtCtx(ctx)
	defer cancel()
	defer s.beat()
	moved := expiredTally{}
	var topic string
	var correlationID *string
	scan := func(rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, []any{&topic, &correlationID}, func() error {
			moved.add(topic, deref(correlationID))
			return nil
		})
		return err
	}
	// Under the page's planner settings, as the listing: the pass reads every
	// tick, also while something holds the horizon (queryPlanned).
	if err := queryPlanned(ctx, s.pool, scan, s.expireSQL, topics, ages, limit, whys); err != nil {
		return nil, s.explain(err)
	}
	return moved, nil
}

// expiredTally counts expired rows per topic, with the first maxLoggedIDs
// correlation ids of each, for reportExpired.
type expiredTally map[string]*expiredTopic

type expiredTopic struct {
	n              int
	correlationIDs []string
}

func (t expiredTally) add(topic, correlationID string) {
	e := t[topic]
	if e == nil {
		e = &expiredTopic{}
		t[topic] = e
	}
	e.n++
	if correlationID != "" && len(e.correlationIDs) < maxLoggedIDs {
		e.correlationIDs = append(e.correlationIDs, logText(correlationID))
	}
}

func (t expiredTally) total() int {
	n := 0
	for _, e := range t {
		n += e.n
	}
	return n
}
