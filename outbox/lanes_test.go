package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// A drain's sweep pages its topics in two lanes, each in a transaction of its
// own (sweep.go, pageLanes): topic b's pages go on while topic a's first send
// is in flight. The producer holds a's first send until the send of b's last
// row has begun, pages later: with one page loop, b's next page would wait for
// a's send, and the sweep would never end. Then each topic's rows arrive once,
// in id order.
func TestLanesPageTheirTopicsAtOnceAndKeepTopicOrder(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	const (
		rowsA, rowsB = 30, 60
		pageSize     = 10 // b's rows take six pages of its lane
	)
	// Interleaved, so that the topics' ids mix as a busy application's do.
	var msgs []outbox.Message
	a, b := topicMessages("a", rowsA), topicMessages("b", rowsB)
	for i := range rowsB {
		if i < rowsA {
			msgs = append(msgs, a[i])
		}
		msgs = append(msgs, b[i])
	}
	writeMessages(t, tbl, msgs...)
	var lastB int64
	for _, r := range readRows(t, tbl) {
		if r.Topic == "b" {
			lastB = max(lastB, r.ID)
		}
	}

	prod := memory.New(memory.Config{MaxBatch: 5})
	var (
		mu        sync.Mutex
		heldA     bool
		bLastSent = make(chan struct{})
	)
	prod.SetSendFunc(func(ctx context.Context, batch producer.Batch) error {
		switch batch.Topic {
		case "b":
			if batch.Messages[len(batch.Messages)-1].ID == lastB {
				close(bLastSent)
			}
		case "a":
			mu.Lock()
			first := !heldA
			heldA = true
			mu.Unlock()
			if !first {
				return nil
			}
			select {
			case <-bLastSent:
			case <-time.After(patience):
				// Not a measure: a bound on a wait that, with the lanes, ends
				// as soon as b's lane reaches its last page.
				t.Errorf("a's first send waited %s for the send of b's last row: b's pages wait for a's", patience)
			}
		}
		return nil
	})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, PageSize: pageSize, Retry: once})
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, rowsA+rowsB, res.Dispatched)
	require.Zero(t, dbtest.Outstanding(t, tbl))
	requireTopicOrder(t, prod.Messages(), map[string]int{"a": rowsA, "b": rowsB})
}

// Lanes keep what one page loop kept, under either ordering: every row sent
// once, and (one sweeper) each topic in id order, with more topics than lanes
// and sweeps that read on past their ticks.
func TestLanesSendEveryRowOnceInTopicOrder(t *testing.T) {
	t.Parallel()
	for _, ordering := range []outbox.Ordering{outbox.OrderingTopic, outbox.OrderingNone} {
		t.Run(string(ordering), func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			const topics, perTopic = 7, 120
			want := map[string]int{}
			var msgs []outbox.Message
			for i := range perTopic {
				for tp := range topics {
					topic := fmt.Sprintf("t%d", tp)
					msgs = append(msgs, outbox.Message{Topic: topic, Payload: fmt.Appendf(nil, "%s-%d", topic, i)})
					want[topic]++
				}
			}
			writeMessages(t, tbl, msgs...)
			prod := memory.New(memory.Config{MaxBatch: 7})
			stop := dbtest.RunSweeper(t, newSweeper(t, dbtest.NewPool(t, 4), prod, outbox.Config{Table: tbl, PageSize: 20,
				Tick: 5 * time.Millisecond, Ordering: ordering}))
			dbtest.Eventually(t, patience, "every row dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
			stop()
			requireTopicOrder(t, prod.Messages(), want)
		})
	}
}

// requireTopicOrder requires got to hold each topic's rows once, want[topic]
// of them, in ascending id order. A topic wanted 0 times must be absent.
func requireTopicOrder(t *testing.T, got []producer.Message, want map[string]int) {
	t.Helper()
	want = maps.Clone(want)
	maps.DeleteFunc(want, func(_ string, n int) bool { return n == 0 })
	seen := map[int64]bool{}
	last := map[string]int64{}
	count := map[string]int{}
	for _, m := range got {
		require.False(t, seen[m.ID], "row %d sent twice", m.ID)
		seen[m.ID] = true
		require.Greater(t, m.ID, last[m.Topic], "topic %s: row %d after row %d", m.Topic, m.ID, last[m.Topic])
		last[m.Topic] = m.ID
		count[m.Topic]++
	}
	require.Equal(t, want, count)
}

// A database error in one lane ends the sweep for both, cleanly: the sweep
// returns it, the failed lane's page rolls back (its rows outstanding again,
// to be sent again), and the other lane's page commits what it sent, so that
// none of its rows is sent twice. Topic a's page loses its session while its
// send is in flight: b's first send ends the session holding a's lock, and a's
// send waits for that, and b's for a's to begin.
func TestLanesEndTogetherOnADatabaseError(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	const rowsA, rowsB = 10, 40
	writeMessages(t, tbl, topicMessages("a", rowsA)...)
	writeMessages(t, tbl, topicMessages("b", rowsB)...)
	ctx := context.Background()
	prod := memory.New(memory.Config{})
	aSending, killed := make(chan struct{}), make(chan struct{})
	var aOnce, killOnce sync.Once
	var (
		mu    sync.Mutex
		sentB = map[int64]int{}
	)
	prod.SetSendFunc(func(ctx context.Context, batch producer.Batch) error {
		switch batch.Topic {
		case "a":
			aOnce.Do(func() { close(aSending) })
			<-killed
		case "b":
			var err error
			killOnce.Do(func() {
				defer close(killed)
				<-aSending // a's page holds a's lock
				var ended bool
				if err = dbtest.Pool(t).QueryRow(ctx, `SELECT bool_or(pg_terminate_backend(l.pid, 10000)) FROM pg_locks l
					WHERE l.locktype = 'advisory' AND (l.classid::bigint << 32 | l.objid::bigint) = $1`,
					tbl.TopicLockKey("a")).Scan(&ended); err == nil && !ended {
					err = errors.New("no session held a's lock")
				}
			})
			if err != nil {
				return fmt.Errorf("end a's page's session: %w", err)
			}
			mu.Lock()
			for _, m := range batch.Messages {
				sentB[m.ID]++
			}
			mu.Unlock()
		}
		return nil
	})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, PageSize: 10})
	_, err := s.Sweep(ctx)
	require.Error(t, err, "a's page could not end")

	// a's page rolled back; b's committed exactly what it sent.
	inHistory := map[int64]bool{}
	outstandingA := 0
	for _, r := range readRows(t, tbl) {
		switch {
		case r.Topic == "a" && !r.Dispatched:
			outstandingA++
		case r.Topic == "b" && r.Dispatched:
			inHistory[r.ID] = true
		}
	}
	require.Equal(t, rowsA, outstandingA, "a's page rolled back")
	mu.Lock()
	for id, n := range sentB {
		require.Equal(t, 1, n, "row %d of b sent once", id)
		require.True(t, inHistory[id], "row %d of b was sent: its lane's page committed it", id)
	}
	require.Len(t, inHistory, len(sentB), "b's history holds only what was sent")
	mu.Unlock()

	// The next sweep sends the rest: b's rows each once in all, in order.
	prod.SetSendFunc(nil)
	before := len(prod.Messages())
	_, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.Zero(t, dbtest.Outstanding(t, tbl))
	var b []producer.Message
	for _, m := range prod.Messages()[before:] {
		if m.Topic == "b" {
			b = append(b, m)
		}
	}
	requireTopicOrder(t, prod.Messages()[before:], map[string]int{"a": rowsA, "b": rowsB - len(sentB)})
	for _, m := range b {
		require.Zero(t, sentB[m.ID], "row %d of b sent again", m.ID)
	}
}
