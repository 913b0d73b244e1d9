package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// OwnAwakeLock exposes a sweeper's own awake lock to the external tests,
// which need the database helpers that the package's own tests cannot import.
type OwnAwakeLock struct{ *awakeLock }

func NewAwakeLock(connConfig *pgx.ConnConfig, t Table) OwnAwakeLock {
	return OwnAwakeLock{newAwakeLock(connConfig, t.WithDefaults(), slog.New(slog.DiscardHandler))}
}

func (l OwnAwakeLock) Close() { l.close() }

// ListenerUp reports whether l's session is connected.
func ListenerUp(l *Listener) bool {
	l.l.mu.Lock()
	defer l.l.mu.Unlock()
	return l.l.up
}

// ListenerSetting reads setting on l's session.
func ListenerSetting(ctx context.Context, l *Listener, setting string) (string, error) {
	var v string
	err := l.l.do(ctx, false, func(ctx context.Context, conn *pgx.Conn, _ uint64) error {
		return conn.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&v)
	})
	return v, err
}

// Setting reads setting on the own lock's session, once it has one.
func (l OwnAwakeLock) Setting(ctx context.Context, setting string) (string, error) {
	var v string
	err := l.conn.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&v)
	return v, err
}

// AwakeKeyOf is the awake lock's key for t.
func AwakeKeyOf(t Table) int64 { return awakeKey(t.WithDefaults()) }

// TxSettings is the statement that sets a page transaction's planner settings.
const TxSettings = txSettings

// MaxLockedTopics bounds the topic locks one transaction holds.
const MaxLockedTopics = maxLockedTopics

// SetCursorReset sets how often s's cursor forgets its floors (by default a
// minute). Tests that must prove a row is found by the floors' own rules, not
// by the reset, set it beyond their length.
func SetCursorReset(s *Sweeper, every time.Duration) { s.cursor = newCursor(every) }

// SetDiscoveryLimit sets the most rows each half of s's listings'
// discovery scan reads (by default discoveryLimit).
func SetDiscoveryLimit(s *Sweeper, n int) { s.store.discoveryLimit = n }

// SetCursorSettle sets how long s's cursor's findings wait before a floor
// moves to them (by default settleAfter), after SetCursorReset.
func SetCursorSettle(s *Sweeper, wait time.Duration) { s.cursor.settleAfter = wait }

// Floors returns s's cursor's floors: every outstanding row of a member topic
// has a higher id than its floor, and of any other topic, than discovery.
func Floors(s *Sweeper) (members map[string]int64, discovery int64) {
	s.cursor.mu.Lock()
	defer s.cursor.mu.Unlock()
	members = make(map[string]int64, len(s.cursor.members))
	for t, f := range s.cursor.members {
		members[t] = f.after
	}
	return members, s.cursor.discovery.after
}

// ForceFullRetention makes r's next run start from the oldest dispatched row.
func ForceFullRetention(r *Retention) { r.fullRun = time.Time{} }

// HistoryWidth is the width of the history partitions for a retention.
func HistoryWidth(retention time.Duration) time.Duration { return historyWidth(retention) }

// PartitionName names the partition of t's history that starts at start.
func PartitionName(t Table, start time.Time) string { return partitionName(t.WithDefaults(), start) }

// FloorChecks returns how many checks of its floors s's cursor has done.
func FloorChecks(s *Sweeper) int {
	s.cursor.mu.Lock()
	defer s.cursor.mu.Unlock()
	return s.cursor.checks
}

// FloorCheckPaused reports whether s's check of its floors has stopped its
// timer (while s is parked).
func FloorCheckPaused(s *Sweeper) bool {
	s.cursor.mu.Lock()
	defer s.cursor.mu.Unlock()
	return s.cursor.checkPaused
}

// OneLane makes s page every sweep in one transaction, as before lanes
// (pageLanes): for the tests of what one page transaction holding several
// topics does.
func OneLane(s *Sweeper) *Sweeper {
	s.lanes = 1
	return s
}

// ClaimedPage exposes a page's end to the external tests.
type ClaimedPage struct{ p *page }

// ClaimPage claims up to share rows of each of topics of t in a page of its
// own, as a sweep's first page does.
func ClaimPage(ctx context.Context, pool *pgxpool.Pool, t Table, topics []string, share int) (ClaimedPage, error) {
	s := newStore(pool, t.WithDefaults(), deadLetterPolicy{}, OrderingNone, time.Minute, &heartbeat{})
	p, _, _, err := claimPage(ctx, s, topics, make([]int64, len(topics)), share)
	return ClaimedPage{p}, err
}

// Rows says how many rows the page holds.
func (c ClaimedPage) Rows() int { return len(c.p.rows) }

// SendAll records every row as accepted by the broker.
func (c ClaimedPage) SendAll() {
	for i := range c.p.rows {
		c.p.rows[i].sent = true
	}
}

// Misplace makes the page look for row id where no row is.
func (c ClaimedPage) Misplace(id int64) {
	c.p.row(id).tid = pgtype.TID{BlockNumber: 1 << 30, OffsetNumber: 1, Valid: true}
}

// End ends the page.
func (c ClaimedPage) End(ctx context.Context) error { return c.p.end(ctx) }

// MoveNonPositiveAside runs the floors' check's move of the rows whose id is
// not positive, telling aside how many it moved.
func MoveNonPositiveAside(ctx context.Context, s *Sweeper, aside func(n int)) bool {
	return s.cursor.nonPositiveAside(ctx, s.store, s.logger, aside)
}
