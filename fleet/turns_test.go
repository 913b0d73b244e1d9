package fleet

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// takeAsync starts take(ctx, resume) and returns a channel that gets its error.
func takeAsync(ctx context.Context, t *turns, resume bool) <-chan error {
	out := make(chan error, 1)
	go func() { out <- t.take(ctx, resume) }()
	return out
}

// queued waits until n sweeps wait in t's queue.
func queued(tb testing.TB, t *turns, n int) {
	tb.Helper()
	require.Eventually(tb, func() bool {
		t.mu.Lock()
		defer t.mu.Unlock()
		return len(t.queue) == n
	}, 10*time.Second, time.Millisecond, "%d sweeps waiting for a turn", n)
}

func granted(tb testing.TB, c <-chan error, what string) {
	tb.Helper()
	select {
	case err := <-c:
		require.NoError(tb, err, what)
	case <-time.After(10 * time.Second):
		tb.Fatalf("%s: no turn", what)
	}
}

// notGranted says a sweep that should still wait has not been given a turn.
// Callers check first that it is still queued (queued): a grant made wrongly
// whose goroutine has not sent its result yet would pass the read alone.
func notGranted(tb testing.TB, c <-chan error, what string) {
	tb.Helper()
	select {
	case err := <-c:
		tb.Fatalf("%s: took a turn (err %v)", what, err)
	default:
	}
}

// A starting sweep goes before a resuming one that waited first, and a
// resuming one does not take a free turn while a starting sweep runs.
func TestTurnsStartingSweepsGoFirst(t *testing.T) {
	tr := newTurns(2)
	tr.hold = time.Hour
	ctx := context.Background()
	require.NoError(t, tr.take(ctx, true))  // a drain's page
	require.NoError(t, tr.take(ctx, false)) // a quiet outbox
	resumed := takeAsync(ctx, tr, true)
	queued(t, tr, 1)
	starting := takeAsync(ctx, tr, false)
	queued(t, tr, 2)

	tr.release(true) // the drain's page ends: the starting sweep goes, not the drain
	granted(t, starting, "the starting sweep")
	queued(t, tr, 1)
	notGranted(t, resumed, "the resuming sweep beside two starting ones")

	tr.release(false) // a turn is free, and a starting sweep still runs
	queued(t, tr, 1)
	notGranted(t, resumed, "the resuming sweep beside a starting one")
	require.True(t, tr.busy(false), "a starting sweep with a page sent sees the drain waiting")

	tr.release(false) // no starting sweep left
	granted(t, resumed, "the resuming sweep once no starting sweep runs")
	require.False(t, tr.busy(true), "the drain alone needs to give nothing back")
}

// A resuming sweep that has waited its hold takes a free turn though
// starting sweeps run: a stream of quiet outboxes slows a drain, and never
// stops it.
func TestTurnsResumingSweepGoesAfterItsHold(t *testing.T) {
	tr := newTurns(2)
	tr.hold = 20 * time.Millisecond
	ctx := context.Background()
	require.NoError(t, tr.take(ctx, false))
	resumed := takeAsync(ctx, tr, true)
	granted(t, resumed, "the resuming sweep after its hold")
	require.True(t, tr.busy(true), "the drain sees the starting sweep running")
	require.False(t, tr.busy(false), "the starting sweep gives nothing back to a drain")
}

// overdue waits until the waiter at i in t's queue has waited its hold.
func overdue(tb testing.TB, t *turns, i int) {
	tb.Helper()
	require.Eventually(tb, func() bool {
		t.mu.Lock()
		defer t.mu.Unlock()
		return len(t.queue) > i && t.queue[i].overdue
	}, 10*time.Second, time.Millisecond, "the sweep waiting at %d overdue", i)
}

// A resuming sweep that has waited its hold is not passed by the starting
// sweeps that come after: with as many awake tenants polling as there are
// turns, one of them waits at every release, and each would take the turn
// ahead of the drain, for as long as they poll.
func TestTurnsAnOverdueResumingSweepIsNotPassedByLaterStartingOnes(t *testing.T) {
	tr := newTurns(1)
	tr.hold = time.Millisecond
	ctx := context.Background()
	require.NoError(t, tr.take(ctx, false)) // a quiet outbox's sweep holds the turn
	resumed := takeAsync(ctx, tr, true)
	queued(t, tr, 1)
	overdue(t, tr, 0)
	starting := takeAsync(ctx, tr, false) // the next poll of an awake tenant
	queued(t, tr, 2)

	tr.release(false)
	granted(t, resumed, "the resuming sweep that waited its hold")
	queued(t, tr, 1)
	notGranted(t, starting, "the starting sweep that came after it")
	tr.release(true)
	granted(t, starting, "the starting sweep, after the drain's page")
}

// A resuming sweep that has waited its hold goes ahead of one that came
// before it and has not: holds differ (shorter in a quiet spell), and the
// first would otherwise hold the second back for the rest of its own.
func TestTurnsAnOverdueResumingSweepGoesAheadOfOneNotYetOverdue(t *testing.T) {
	tr := newTurns(1)
	tr.hold, tr.quietHold = time.Hour, time.Millisecond
	ctx := context.Background()
	require.NoError(t, tr.take(ctx, false)) // a starting sweep holds the turn
	first := takeAsync(ctx, tr, true)       // a drain, waiting an hour's hold
	queued(t, tr, 1)
	tr.swept(false, 1, false) // a quiet sweep ends: the next drain's hold is quietHold
	second := takeAsync(ctx, tr, true)
	queued(t, tr, 2)
	overdue(t, tr, 0) // the second, moved to the front

	tr.release(false)
	granted(t, second, "the resuming sweep that waited its hold")
	queued(t, tr, 1)
	notGranted(t, first, "the one that came first, its hold not out")
	tr.release(true)
	granted(t, first, "the first, once no sweep runs")
}

// A sweep whose context ends while it waits leaves the queue, and those it
// held back go.
func TestTurnsCanceledWaiterLeavesTheQueue(t *testing.T) {
	tr := newTurns(1)
	tr.hold = time.Hour
	ctx := context.Background()
	require.NoError(t, tr.take(ctx, false))
	cctx, cancel := context.WithCancel(ctx)
	canceled := takeAsync(cctx, tr, false)
	resumed := takeAsync(ctx, tr, true)
	queued(t, tr, 2)
	cancel()
	select {
	case err := <-canceled:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the canceled take did not return")
	}
	queued(t, tr, 1)
	tr.release(false)
	granted(t, resumed, "the resuming sweep behind the canceled one")
	tr.release(true)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	require.Equal(t, 1, tr.free)
	require.Zero(t, tr.starting)
}

// However sweeps of both kinds come and go, no more than n hold a turn at
// once, and every one gets its turn.
func TestTurnsNeverExceedTheirCount(t *testing.T) {
	const n = 3
	tr := newTurns(n)
	tr.hold = time.Millisecond
	var held, most atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 200 {
				resume := (g+i)%3 == 0
				require.NoError(t, tr.take(context.Background(), resume))
				h := held.Add(1)
				for {
					m := most.Load()
					if h <= m || most.CompareAndSwap(m, h) {
						break
					}
				}
				_ = tr.busy(resume)
				held.Add(-1)
				tr.release(resume)
			}
		})
	}
	wg.Wait()
	require.LessOrEqual(t, most.Load(), int64(n))
	require.Positive(t, most.Load())
	require.Equal(t, n, tr.free)
	require.Zero(t, tr.starting)
}

// A resuming sweep waits, a turn free, until no sweep has started for quiet,
// and meanwhile a drain's sweep gives its turn back after each page.
func TestTurnsResumingSweepWaitsForALull(t *testing.T) {
	tr := newTurns(2)
	tr.hold = time.Hour
	tr.quiet = time.Hour
	ctx := context.Background()
	require.NoError(t, tr.take(ctx, false))
	tr.release(false) // a quiet outbox's one-page sweep, over
	require.True(t, tr.busy(true), "a drain's sweep gives its turn back right after a sweep started")
	require.False(t, tr.busy(false), "a starting sweep alone goes on")
	resumed := takeAsync(ctx, tr, true)
	queued(t, tr, 1)
	notGranted(t, resumed, "the resuming sweep right after a sweep started")

	tr.mu.Lock()
	tr.lastStart = time.Now().Add(-2 * time.Hour) // the lull has come
	tr.dispatch()
	tr.mu.Unlock()
	granted(t, resumed, "the resuming sweep after the lull")
	require.False(t, tr.busy(true), "the drain alone in a lull goes on")
}

// A quiet sweep (a starting one that sent a few rows) limits every page to
// quietPage for quietSpell, and shortens a resuming sweep's hold to
// quietHold: a drain beside quiet outboxes sends short pages, about as many
// rows a second. A drain's own start, a sweep that found nothing and a
// resuming sweep's last few rows limit nothing.
func TestTurnsQuietSweepsShortenADrainsPages(t *testing.T) {
	tr := newTurns(2)
	// The spell outlasts the test, however slow the machine: only the
	// stored time ends it.
	tr.hold, tr.quietHold, tr.quietSpell = time.Hour, 20*time.Millisecond, time.Hour
	ctx := context.Background()
	require.Zero(t, tr.pageLimit(), "no sweep yet")
	tr.swept(false, 500, true)
	tr.swept(false, 19, true) // a drain's first page, of short topics, at its yield
	tr.swept(false, quietPage, false)
	tr.swept(false, 0, false)
	tr.swept(true, 3, false)
	require.Zero(t, tr.pageLimit(), "a drain's start, a page's worth, an empty sweep and a drain's end are not quiet")

	tr.swept(false, quietPage-1, false)
	require.Equal(t, quietPage, tr.pageLimit(), "a quiet sweep ended a moment ago")
	require.NoError(t, tr.take(ctx, false)) // quiet outboxes keep starting
	resumed := takeAsync(ctx, tr, true)
	granted(t, resumed, "the resuming sweep after the quiet hold, not the hour")

	tr.born = tr.born.Add(-2 * tr.quietSpell) // as if it had ended two spells ago
	require.Zero(t, tr.pageLimit(), "the last quiet sweep ended longer than quietSpell ago")
}
