package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// resentLog is an outbox.ResendObserver that keeps what Resent is told.
type resentLog struct {
	ignored
	mu sync.Mutex
	n  map[[2]string]int // by topic and cause
}

func (l *resentLog) Resent(topic, cause string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n[[2]string{topic, cause}] += n
}

func (l *resentLog) count(topic, cause string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[[2]string{topic, cause}]
}

// Rows the broker took whose page then rolls back (its session ended before
// the commit) are counted as rolled_back: each will be sent again.
func TestResentCountsARolledBackPagesSentRows(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("a", 5)...)
	ctx := context.Background()
	prod := memory.New(memory.Config{})
	var once sync.Once
	prod.SetSendFunc(func(context.Context, producer.Batch) error {
		var err error
		once.Do(func() {
			var ended bool
			// The broker takes the batch; meanwhile the page's session ends.
			if err = dbtest.Pool(t).QueryRow(ctx, `SELECT bool_or(pg_terminate_backend(l.pid, 10000)) FROM pg_locks l
				WHERE l.locktype = 'advisory' AND (l.classid::bigint << 32 | l.objid::bigint) = $1`,
				tbl.TopicLockKey("a")).Scan(&ended); err == nil && !ended {
				err = errors.New("no session held a's lock")
			}
		})
		return err
	})
	log := &resentLog{n: map[[2]string]int{}}
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, Observer: log})
	_, err := s.Sweep(ctx)
	require.Error(t, err, "the page could not end")
	require.Equal(t, 5, dbtest.Outstanding(t, tbl), "the page rolled back")
	require.Equal(t, 5, log.count("a", outbox.ResendRolledBack))
	require.Zero(t, log.count("a", outbox.ResendUnknownOutcome))
}

// A send that fails in a way that may have delivered its rows counts them
// as unknown_outcome, at each try (the in-call retries, the splits that look
// for a bad row: 16 here); a refusal, which sent nothing, counts none.
func TestResentCountsFailuresThatMayHaveDelivered(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("lost", 3)...)
	writeMessages(t, tbl, topicMessages("refused", 4)...)
	prod := memory.New(memory.Config{})
	prod.SetSendFunc(func(_ context.Context, b producer.Batch) error {
		if b.Topic == "refused" {
			return producer.NewTopicError("topic_not_found", errors.New("no such topic"))
		}
		return errors.New("connection reset after the request went")
	})
	log := &resentLog{n: map[[2]string]int{}}
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, Observer: log})
	_, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.GreaterOrEqual(t, log.count("lost", outbox.ResendUnknownOutcome), 3, "every row of the failed send at least once")
	require.Zero(t, log.count("refused", outbox.ResendUnknownOutcome))
	require.Zero(t, log.count("lost", outbox.ResendRolledBack))
}

// A page whose end does not find a sent row where it locked it moves none of
// its rows: the move's own check fails it, the page rolls back, its rows stay
// outstanding to be sent again, and the error says what happened.
func TestAPageThatCannotFindASentRowMovesNothing(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("a", 5)...)
	ctx := context.Background()
	p, err := outbox.ClaimPage(ctx, dbtest.Pool(t), tbl, []string{"a"}, 10)
	require.NoError(t, err)
	require.Equal(t, 5, p.Rows())
	var id int64
	require.NoError(t, dbtest.Pool(t).QueryRow(ctx, "SELECT min(id) FROM "+tbl.Ident()).Scan(&id))
	p.SendAll()
	p.Misplace(id)
	err = p.End(ctx)
	require.ErrorContains(t, err, "the page moved 4 of its 5 sent rows")
	require.ErrorContains(t, err, "they will be sent again")
	require.Equal(t, 5, dbtest.Outstanding(t, tbl), "every row still outstanding")
	var moved int
	require.NoError(t, dbtest.Pool(t).QueryRow(ctx, "SELECT count(*) FROM "+outbox.HistoryIdent(tbl)).Scan(&moved))
	require.Zero(t, moved, "nothing in the history")
}
