package fleet

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of turns' pacing of resuming sweeps.
const (
	// resumeQuietDefault is how long no sweep may have started before a
	// resuming one goes: quiet outboxes' sweeps come in bursts (a commit, a
	// notification, a one-row page), and a drain's page that starts in the
	// middle of a burst runs beside the next of its sweeps.
	resumeQuietDefault = 10 * time.Millisecond
	// resumeHoldDefault is the longest a resuming sweep waits while a turn
	// is free: while quiet outboxes keep starting sweeps, a drain sends a
	// page per hold (10,000 rows a second at the default page size) rather
	// than none.
	resumeHoldDefault = 50 * time.Millisecond

	// quietPage is the most rows a page reads, and quietHold the longest a
	// resuming sweep waits while a turn is free, within quietSpell of a
	// quiet sweep's end: a starting sweep that sent rows, fewer than
	// quietPage, and ended with none left (not a drain's first page, given
	// at its yield). A drain's page is a burst of work for both the
	// database and the process (its claim, its sends, its move to history),
	// and a quiet outbox's sweep that starts during one waits on the machine
	// until it ends. Beside quiet outboxes sweeping ten times a second or
	// more, a drain waits at most 12 ms for each page of 100 while sweeps
	// keep starting, rather than 50 ms for each of 500: bursts a fifth as
	// long, for four fifths of the rows a second (ADR 0002). Drains beside
	// sparser quiet sweeps read whole pages most of the time, and so do
	// drains alone (many outboxes draining at once, after a broker's
	// outage).
	quietPage  = 100
	quietHold  = 12 * time.Millisecond
	quietSpell = 100 * time.Millisecond
)

// turns bounds the sweeps at once (outbox.Host's Take) and chooses who goes
// next. Sweeps are of two kinds:
//
//   - a starting sweep: an outbox woken by a commit or by reconciliation,
//     usually a few rows;
//   - a resuming sweep: a drain's, one that has sent a page and has more, and
//     gave its turn back between pages (outbox.Host's Waiting), or whose
//     last sweep ended with rows left.
//
// Starting sweeps go first, in the order they came, ahead of the resuming
// ones that have not waited hold. Resuming ones go, in the order they came
// (those that have waited hold first), when no sweep has started for quiet,
// or once they have waited hold; and while sweeps start, a resuming one gives its turn back
// after each page and claims none ahead (busy). So a drain's pages fill the
// lulls between quiet outboxes' sweeps rather than run beside them. On a
// small machine a drain left to run beside them keeps every core busy: in
// issue 33's latency benchmark (2 cores, 10 tenants committing 500 rows a
// second beside one draining), their p99 was 14 to 18 times their p99
// alone, whether the drain waited only for a free turn or also for no
// starting sweep to run; with quiet and hold as they are, 0.61 to 2.07
// times (median 1.36 over twelve runs, windows alone and beside taking
// turns; 1.05 to 1.86 in the five a quiet machine gave), the drain slowed
// from 60,000 to about 8,000 rows a second while the quiet tenants wrote
// (ADR 0002). A hold of 100 ms, which halves that, did no better. Beside
// quiet outboxes' sweeps a drain's pages are also shorter (pageLimit): in
// alternate runs on a quiet machine, their p99 beside it after its first
// window went from 3.9 ms (mean; 2-3 ms alone) to 3.2, for a fifth of the
// drain. With no quiet tenant about, drains share the turns at full pace.
type turns struct {
	quiet, hold time.Duration
	// quietHold, quietSpell and quietPage: see their defaults.
	quietHold, quietSpell time.Duration
	quietPage             int
	// quietAt is when a quiet sweep last ended, in nanoseconds since born
	// plus one (0: none yet), read at every page's claim (pageLimit): the
	// monotonic clock's, so that a step of the wall clock neither starts
	// nor prolongs a spell.
	quietAt atomic.Int64
	born    time.Time

	mu        sync.Mutex
	free      int       // turns not held
	starting  int       // starting sweeps holding a turn
	lastStart time.Time // when a starting sweep last took its turn
	queue     []*waiter // starting sweeps first, then resuming ones, each in order of arrival
	lull      *time.Timer
}

type waiter struct {
	resume bool
	// overdue says a resuming waiter has waited hold: it goes when a turn is
	// free, starting sweeps running or not.
	overdue bool
	granted chan struct{} // closed when the waiter has its turn
}

func newTurns(n int) *turns {
	return &turns{free: n, quiet: resumeQuietDefault, hold: resumeHoldDefault,
		quietHold: quietHold, quietSpell: quietSpell, quietPage: quietPage, born: time.Now()}
}

// swept records the end of a sweep's turn taken by take(ctx, resume) that
// sent sent rows in it, more saying rows are left (outbox.SweepResult's
// More): a starting sweep that sent a few rows and has none left is a quiet
// outbox's.
func (t *turns) swept(resume bool, sent int, more bool) {
	if !resume && !more && sent > 0 && sent < t.quietPage {
		t.quietAt.Store(int64(time.Since(t.born)) + 1)
	}
}

// quietNow reports whether a quiet sweep ended within quietSpell.
func (t *turns) quietNow() bool {
	at := t.quietAt.Load()
	return at != 0 && time.Since(t.born)-time.Duration(at-1) < t.quietSpell
}

// pageLimit is outbox.PagingHost's PageLimit for every outbox of the fleet:
// quietPage while quiet outboxes sweep, else none. A quiet outbox's own pages
// hold its few rows whatever the limit.
func (t *turns) pageLimit() int {
	if t.quietNow() {
		return t.quietPage
	}
	return 0
}

// take waits for a turn: a starting sweep's, or (resume) a resuming one's.
func (t *turns) take(ctx context.Context, resume bool) error {
	w := &waiter{resume: resume, granted: make(chan struct{})}
	t.mu.Lock()
	if !resume {
		// Behind the starting sweeps already waiting and the resuming ones
		// that have waited hold, ahead of every other resuming one: ahead of
		// an overdue one too, a stream of starting sweeps (as many awake
		// tenants polling as there are turns) would have one waiting at
		// every release, and the drain would never go.
		t.queue = slices.Insert(t.queue, t.behindOverdue(), w)
	} else {
		t.queue = append(t.queue, w)
	}
	t.dispatch()
	t.mu.Unlock()

	var overdue <-chan time.Time
	if resume {
		hold := t.hold
		if t.quietNow() {
			hold = t.quietHold
		}
		timer := time.NewTimer(hold)
		defer timer.Stop()
		overdue = timer.C
	}
	for {
		select {
		case <-w.granted:
			return nil
		case <-overdue:
			overdue = nil
			t.mu.Lock()
			w.overdue = true
			// Ahead of the resuming sweeps that have not waited their hold
			// (one that came before it with the longer hold, while no quiet
			// spell ran), which would hold it back as long again.
			if i := slices.Index(t.queue, w); i >= 0 {
				t.queue = slices.Delete(t.queue, i, i+1)
				t.queue = slices.Insert(t.queue, t.behindOverdue(), w)
			}
			t.dispatch()
			t.mu.Unlock()
		case <-ctx.Done():
			t.mu.Lock()
			defer t.mu.Unlock()
			select {
			case <-w.granted: // granted as ctx ended: give it back
				t.give(w.resume)
			default:
				t.queue = slices.DeleteFunc(t.queue, func(q *waiter) bool { return q == w })
				t.dispatch() // w may have held back those behind it
			}
			return ctx.Err()
		}
	}
}

// behindOverdue returns where in the queue the resuming sweeps that have not
// waited their hold begin (its length if none waits), under mu.
func (t *turns) behindOverdue() int {
	if i := slices.IndexFunc(t.queue, func(q *waiter) bool { return q.resume && !q.overdue }); i >= 0 {
		return i
	}
	return len(t.queue)
}

// release gives back a turn taken by take(ctx, resume).
func (t *turns) release(resume bool) {
	t.mu.Lock()
	t.give(resume)
	t.mu.Unlock()
}

func (t *turns) give(resume bool) {
	t.free++
	if !resume {
		t.starting--
	}
	t.dispatch()
}

// dispatch hands free turns to the waiters at the head of the queue, under mu.
func (t *turns) dispatch() {
	for t.free > 0 && len(t.queue) > 0 {
		w := t.queue[0]
		if w.resume && !w.overdue {
			if t.starting > 0 {
				return // its release dispatches again
			}
			if lull := t.quiet - time.Since(t.lastStart); lull > 0 {
				t.dispatchIn(lull)
				return
			}
		}
		t.queue = t.queue[1:]
		t.free--
		if !w.resume {
			t.starting++
			t.lastStart = time.Now()
		}
		close(w.granted)
	}
}

// dispatchIn dispatches again after d, when no sweep may have started since,
// under mu.
func (t *turns) dispatchIn(d time.Duration) {
	if t.lull == nil {
		t.lull = time.AfterFunc(d, func() {
			t.mu.Lock()
			t.dispatch()
			t.mu.Unlock()
		})
		return
	}
	t.lull.Reset(d)
}

// busy reports whether a sweep holding a turn taken by take(ctx, resume)
// should give it back after its page, the sweep having sent a page already
// and having more: another sweep waits for a turn, another starting sweep
// runs, or, for a resuming sweep, one started within quiet.
func (t *turns) busy(resume bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	others := t.starting
	if !resume {
		others-- // itself
	}
	return len(t.queue) > 0 || others > 0 || (resume && time.Since(t.lastStart) < t.quiet)
}
