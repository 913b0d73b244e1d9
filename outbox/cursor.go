package outbox

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// cursor remembers, across sweeps, where each topic's outstanding rows begin,
// so that a sweep reads each topic from there rather than from its lowest id.
//
// Why: moving a sent row to the history table is a DELETE that leaves the
// row's entries in the outstanding indexes, and so does a move to the
// dead-letter table (before the history table, a mark, an UPDATE, left its old
// version's entries the same way). Those entries go only when vacuum
// removes the dead versions, and vacuum may not remove a version while any
// snapshot that could see it is open: a report, pg_dump, a replica with
// hot_standby_feedback. Index entries carry no visibility, so a scan that
// starts from a topic's lowest id visits every such entry and its heap tuple,
// every sweep, and while something holds the horizon the visits grow with
// every row sent: the sweep slows as the dead rows pile up, and the relay
// falls behind the application (issue 32 measured 3,000 rows/s offered, 1,100
// relayed, 75 s of lag). With the cursor a sweep visits only the entries of
// the last sweeps, whatever is held.
//
// The hard part is rows that commit out of id order. Ids are drawn at insert,
// so a transaction may hold id 100 uncommitted while id 101 commits and is
// sent; a floor moved past 101 would never see 100. What a scan did not see
// below the ids it saw was written by transactions running when its snapshot
// was taken (an id below one the snapshot sees was drawn before that row's
// transaction committed, so before the snapshot). Those transactions have all
// ended once a later snapshot's xmin (the oldest running transaction) passes
// the first snapshot's xmax. So a sweep's findings are kept pending, stamped
// with the xmax of the next sweep's snapshot (later than every snapshot the
// sweep used), and a floor moves to them only in a sweep whose snapshot shows
// those transactions ended, and only as far as that sweep, reading from the
// old floor, also found nothing left behind. This is the rule watermill's
// Postgres adapter follows (it moves its offset only below
// pg_snapshot_xmin(pg_current_snapshot())). Only transactions that wrote
// something hold xmin back: a read-only report or pg_dump, which holds the
// vacuum horizon for minutes, does not hold the cursor.
//
// New topics are found by reading the outstanding index by id from a
// discovery floor that moves by the same rule: every topic with outstanding
// rows below it is a member, with a floor of its own. A member whose floor
// shows nothing outstanding is let go once the discovery floor has passed its
// rows, so the cursor holds only topics with outstanding rows. A cursor that
// knows nothing (the sweeper's start, a reset) first lists the topics with
// outstanding rows by a skip scan, once (seedable): discovery alone, a
// listing's limit of rows at a time, found the topics behind a tripped
// topic's deep backlog only listings later.
//
// Anything that puts a row back below a floor other than a sweep (an
// operator's copy of a sent row back from history with its own id, say) is
// found by a check every resetEvery, beside the sweeps (below_floors.sql): when
// it finds such a row the cursor forgets everything and the next sweep starts
// over from the lowest ids. The check, not the sweep, walks whatever dead
// entries lie below the floors; the cursor once forgot its floors blindly
// every minute, and the sweep after paid that walk per topic and per page.
// A transaction that wrote to the database
// and stays open holds floors where they are until it ends (the sweep then
// rereads what came after them, as it did before the cursor), never longer.
type cursor struct {
	mu sync.Mutex
	// members maps each topic known to have outstanding rows to its floor.
	members map[string]*floor
	// discovery is the floor of the discovery scan: a topic with outstanding
	// rows whose id is at most discovery.after is a member.
	discovery floor
	// seen is the highest id discovery has read since the last reset.
	seen int64
	// xmin and xmax are those of the current sweep's snapshot (listing).
	xmin, xmax uint64
	// stale says a check found an outstanding row below the floors: the next
	// sweep forgets everything. resetEvery is how often the floors are checked.
	stale      bool
	resetEvery time.Duration
	// settleAfter is settleAfter, a field so that tests can stretch it.
	settleAfter time.Duration
	// checks counts the checks done, and checkPaused says checkFloors'
	// timer is stopped, for tests.
	checks      int
	checkPaused bool
	// lastReread is when a listing last read again the rows discovery read
	// before; rereadSkipped says the last listing did not (rereadEvery).
	lastReread    time.Time
	rereadSkipped bool
	// left holds the topics the current sweep leaves out (begin's
	// excluded). Their floors stand still until a sweep reads them: nothing
	// is stamped or settled for them, which only moves them later. Why: a
	// flood's 100,000 tripped topics stay members, and stamping and ending
	// each one's floor twice a sweep was a fifth of every sweep's time.
	left map[string]bool
	// seeded says the members were listed by seed since the cursor last
	// knew nothing (seedable).
	seeded bool
}

// floor is one topic's (or the discovery scan's) floor: every outstanding row
// has an id above after. pending holds findings waiting for the transactions
// that were running when they were made to end.
type floor struct {
	after   int64
	pending []pendingFloor
	// found is the current sweep's finding (valid when scanned): nothing
	// outstanding at or below it was left behind. settle is the pending
	// finding whose transactions ended before this sweep began (valid when
	// settling): the floor moves to min(settle, found) if the sweep succeeds.
	found, settle     int64
	scanned, settling bool
	// empty says this sweep's listing found nothing outstanding above after.
	empty bool
	// unstamped is the last sweep's finding, stamped with the next sweep's
	// xmax when it lists.
	unstamped    int64
	hasUnstamped bool
}

type pendingFloor struct {
	after int64
	xmax  uint64
	// at is when the finding was stamped; zero for one already settled once.
	at time.Time
}

// maxPending bounds the findings a floor keeps while something holds xmin or
// they wait out settleAfter: past it new findings are dropped, which only
// moves the floor later.
const maxPending = 8

// settleAfter is how long a finding waits, besides the transactions it saw
// running, before a floor moves to it. An INSERT draws its row's id before its
// transaction has an id of its own (Postgres assigns one at the first write,
// just after the defaults are computed), so for that moment the row is in no
// snapshot's list of running transactions, and a floor could pass it. The wait
// covers that moment with room for a writer the machine stalls (the soak found
// such rows at 3,000 rows/s on a loaded 2-core machine); one stalled longer
// waits for the cursor's reset. Findings are kept at most one per quarter of
// it, so a floor trails the sweeps by at most 1.25 × settleAfter of rows.
const settleAfter = time.Second

// rereadEvery is how often a listing reads again the rows discovery has read
// above its floor, to find among them those that committed out of id order:
// rows of a topic the cursor does not know (a new one, or one let go), which
// no member's probe reads. The rows of known topics are read by their probes
// at every listing.
//
// Why not at every listing: the reread is the one part of a listing whose
// cost grows with the rows written rather than with the topics. At every
// listing, a drain's first second read the whole backlog again each sweep,
// until the discovery floor could move past it; at --tick 50ms, where the
// sweep ends at each tick under OrderingTopic, the listings took 0.8 s of a
// 2.3 s drain of 100,000 rows (1.4 s at the default tick; issue 32). A floor
// moves only settleAfter after a finding, and findings are kept one per
// quarter of it, so a reread every quarter loses the floors nothing. The
// price: such a row waits for the next reread, up to rereadEvery (the
// sweeper polls for it: rereadAt).
const rereadEvery = settleAfter / 4

// cursorResetEvery is how often the floors are checked for a row put back
// below one by anything other than a sweep: such a row waits at most this
// long, and the check's walk.
const cursorResetEvery = time.Minute

func newCursor(resetEvery time.Duration) *cursor {
	return &cursor{members: map[string]*floor{}, resetEvery: resetEvery, settleAfter: settleAfter}
}

// begin starts a sweep: it forgets everything if a check found a row below
// the floors, and returns the members to probe (less excluded) with their
// floors, the discovery floor, the highest id discovery has read (rows above
// it are new), and whether the listing reads again the rows discovery has read
// above its floor (see rereadDue).
func (c *cursor) begin(excluded map[string]bool) (topics []string, after []int64, discovery, seen int64, reread bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resetIfStale()
	c.left = excluded
	topics = make([]string, 0, len(c.members))
	after = make([]int64, 0, len(c.members))
	for t, f := range c.members {
		if !excluded[t] {
			topics, after = append(topics, t), append(after, f.after)
		}
	}
	now := time.Now()
	// Nothing to read again costs nothing: the listing reads it, and finds.
	if reread = c.seen <= c.discovery.after || now.Sub(c.lastReread) >= rereadEvery; reread {
		c.lastReread = now
	}
	c.rereadSkipped = !reread
	return topics, after, c.discovery.after, c.seen, reread
}

// resetIfStale forgets everything if a check asked for it, under mu.
func (c *cursor) resetIfStale() {
	if c.stale {
		c.members = map[string]*floor{}
		c.discovery = floor{}
		c.seen = 0
		c.stale = false
		c.seeded = false
	}
}

// seedable forgets everything if a check asked for it, and reports whether
// the cursor knows nothing (the sweeper's start, a reset) and has not been
// seeded since: the sweep then lists the topics with outstanding rows by a
// skip scan (seed) before its listing.
//
// Why: discovery reads the outstanding rows by id, a listing's limit at a
// time, and a cursor that knows nothing knows no topic. Behind a tripped
// topic's backlog of 3,000,000 rows, the topics written after it were found
// thirty listings later, at every start and every reset (an independent
// review, 2026-11-29). The skip scan costs a seek per topic, and like the
// probes that follow it from the lowest ids, it may walk the dead entries at
// the head of each topic's rows while something holds the vacuum horizon;
// it runs once per start or reset. A topic that first appears during the
// crawl is still found by discovery alone.
func (c *cursor) seedable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resetIfStale()
	return !c.seeded && len(c.members) == 0 && c.seen == 0 && c.discovery.after == 0
}

// seed makes topics members, each with the discovery floor: a topic that
// is not a member holds no outstanding row at or below it.
func (c *cursor) seed(topics []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seeded = true
	for _, t := range topics {
		if _, ok := c.members[t]; !ok {
			c.members[t] = &floor{after: c.discovery.after}
		}
	}
}

// rereadAt returns when a sweep should come to read again the rows discovery
// has read above its floor, if the last listing left them unread: so that a
// row that committed out of id order among them is found within rereadEvery,
// however long the tick.
func (c *cursor) rereadAt() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastReread.Add(rereadEvery), c.rereadSkipped
}

// listed records what the sweep's listing found: its snapshot's xmin and
// xmax, the members it found outstanding rows for (live), those it found none
// for (empty), and the topics the discovery scan found above the discovery
// floor, with the highest id it read (0: none); reread says it read again the
// rows read before (begin asked it to), and cut that it stopped at rereadTo.
// It returns each live or new topic's floor.
func (c *cursor) listed(xmin, xmax uint64, live, empty []string, fresh []string, last int64, reread, cut bool, rereadTo int64) map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.xmin, c.xmax = xmin, xmax
	now := time.Now()
	for t, f := range c.members {
		if !c.left[t] {
			f.start(xmin, xmax, now, c.settleAfter)
		}
	}
	// Every outstanding row the snapshot shows up to the highest id discovery
	// has ever read belongs to a member now: those up to the floor already
	// did, and the scan read the rest (a scan that read nothing shows there
	// are none). Unless the reread stopped short: then only those up to
	// where it stopped. A listing that did not read them again finds nothing.
	c.discovery.start(xmin, xmax, now, c.settleAfter)
	c.seen = max(c.seen, last, c.discovery.after)
	switch {
	case !reread:
	case cut:
		c.discovery.scan(max(rereadTo, c.discovery.after))
	default:
		c.discovery.scan(c.seen)
	}
	for _, t := range fresh {
		if _, ok := c.members[t]; !ok {
			f := &floor{after: c.discovery.after}
			f.start(xmin, xmax, now, c.settleAfter)
			c.members[t] = f
		}
	}
	for _, t := range empty {
		c.members[t].empty = true
	}
	floors := make(map[string]int64, len(live)+len(fresh))
	for _, t := range live {
		floors[t] = c.members[t].after
	}
	for _, t := range fresh {
		floors[t] = c.members[t].after
	}
	return floors
}

// floors returns every member with its floor, and the discovery floor: what
// the check compares the outbox with.
func (c *cursor) floors() (topics []string, after []int64, discovery int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, f := range c.members {
		topics, after = append(topics, t), append(after, f.after)
	}
	return topics, after, c.discovery.after
}

// markStale makes the next sweep forget everything.
func (c *cursor) markStale() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stale = true
}

// checkFloors checks the floors every c.resetEvery, until ctx ends, and marks
// the cursor stale when an outstanding row lies below them or the check
// fails (forgetting is always safe; it only costs a walk).
//
// While parked is set, the outbox held nothing at the last sweep and there is
// nothing to check: the host that woke it calls Recheck instead. So the
// timer stops when changed says parked was set, and starts again when it
// says parked was cleared: a thousand parked outboxes' tickers of a minute
// woke an idle fleet 17 times a second, each a futex and a scheduler pass,
// half of the process's CPU at rest (BENCHMARKS.md, 2026-11-28).
func (c *cursor) checkFloors(ctx context.Context, s *store, logger *slog.Logger, parked *atomic.Bool, changed <-chan struct{}, aside func(n int)) {
	t := time.NewTimer(c.resetEvery)
	defer t.Stop()
	// due is when the next check falls: a timer started again resumes the
	// minute where it stopped, so that an outbox awake for less than a
	// minute at a time still has its floors checked.
	due := time.Now().Add(c.resetEvery)
	ticking := true
	pause := func(p bool) {
		ticking = !p
		c.mu.Lock()
		c.checkPaused = p
		c.mu.Unlock()
	}
	if parked.Load() { // a Run started again on a parked sweeper
		t.Stop()
		pause(true)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			// Read after the signal: a change after this read signals again.
			p := parked.Load()
			switch {
			case p && ticking:
				t.Stop()
			case !p && !ticking:
				t.Reset(max(time.Millisecond, time.Until(due)))
			}
			pause(p)
			continue
		case <-t.C:
			ticking = false // fired: it runs again only once reset
		}
		if parked.Load() {
			// Parked just now: its signal is on its way. The check is owed,
			// and runs as soon as the outbox wakes, rather than a whole
			// minute of its waking later.
			due = time.Now()
			continue
		}
		due = time.Now().Add(c.resetEvery)
		t.Reset(c.resetEvery)
		ticking = true
		topics, after, discovery := c.floors()
		checkCtx, cancel := context.WithTimeout(ctx, dbTimeout)
		below, err := s.belowFloors(checkCtx, topics, after, discovery)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			logger.Warn("checking the cursor's floors failed; the next sweep reads every topic from its first row",
				"table", s.table.String(), "err", err)
			c.markStale()
		case below && c.nonPositiveAside(ctx, s, logger, aside):
			// Only rows no sweep could ever send were below: nothing to forget.
		case below:
			logger.Info("an outstanding row lies below where the sweeps read (put back by hand, or its writer stalled); "+
				"the next sweep reads every topic from its first row", "table", s.table.String())
			c.markStale()
		}
		c.mu.Lock()
		c.checks++
		c.mu.Unlock()
	}
}

// nonPositiveAside moves the outstanding rows whose id is not positive, if
// any, to the dead-letter table: no floor starts below 0, so no sweep would
// ever read them, and forgetting the floors for them only made every sweep
// read every topic again, once a minute (dead_letter_nonpositive.sql). It
// reports whether the floors then hold no outstanding row below them.
func (c *cursor) nonPositiveAside(ctx context.Context, s *store, logger *slog.Logger, aside func(n int)) bool {
	moveCtx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	moved, err := s.deadLetterNonPositive(moveCtx, maxNonPositive)
	rows := len(moved)
	if err != nil {
		logger.Warn("moving the rows whose id is not positive to the dead-letter table failed; they are never sent: "+
			"give each an id of its own (UPDATE … SET id = DEFAULT WHERE id <= 0)", "table", s.table.String(), "err", err)
		return false
	}
	if len(moved) == 0 {
		return false
	}
	aside(rows)
	slices.Sort(moved)
	moved = slices.Compact(moved)
	shown := make([]string, 0, min(len(moved), maxLoggedTopics))
	for _, t := range moved[:min(len(moved), maxLoggedTopics)] {
		shown = append(shown, logText(t))
	}
	logger.Warn("rows written with an id of 0 or less were dead-lettered (reason invalid_id): the sweeper reads ids from 1 up "+
		"and would never send them; replay them to send them under ids of their own (sweeper dlq replay --reason invalid_id)",
		"table", s.table.String(), "num_rows", rows, "topics", shown)
	topics, after, discovery := c.floors()
	below, err := s.belowFloors(moveCtx, topics, after, discovery)
	return err == nil && !below
}

// maxNonPositive bounds the rows one check moves aside; more wait for the
// next check.
const maxNonPositive = 1000

// start stamps the last sweep's finding and takes the settled one.
func (f *floor) start(xmin, xmax uint64, now time.Time, wait time.Duration) {
	f.scanned, f.settling, f.empty = false, false, false
	if f.hasUnstamped {
		n := len(f.pending)
		if n < maxPending && (n == 0 || now.Sub(f.pending[n-1].at) >= wait/4) {
			f.pending = append(f.pending, pendingFloor{after: f.unstamped, xmax: xmax, at: now})
		}
		f.hasUnstamped = false
	}
	n := 0
	for n < len(f.pending) && f.pending[n].xmax <= xmin && now.Sub(f.pending[n].at) >= wait {
		f.settle, f.settling = f.pending[n].after, true
		n++
	}
	f.pending = f.pending[n:]
}

// scan notes what this sweep found: nothing outstanding at or below after
// was left behind (it can only lower a finding made earlier in the sweep).
func (f *floor) scan(after int64) {
	if !f.scanned || after < f.found {
		f.found = after
	}
	f.scanned = true
}

// found notes that topic's rows up to after (its reach, or one before a row
// left outstanding) were dealt with in this sweep, as far as its snapshots saw.
func (c *cursor) found(topic string, after int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.members[topic]; ok {
		f.scan(after)
	}
}

// done ends a sweep. After a successful one every floor settled in it moves,
// and its findings wait for their transactions; after a failed one the
// settled findings go back (rows may have been left anywhere) and the
// findings are dropped.
func (c *cursor) done(ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.discovery.end(ok)
	left := c.left
	c.left = nil
	for t, f := range c.members {
		if left[t] {
			continue // not started in this sweep (listed)
		}
		// A member that showed nothing outstanding above its floor is let go.
		// It has none at or below the discovery floor either: every row up
		// to that floor was visible to this sweep's snapshot (that is what
		// the floor's settling means), and none below its own floor is
		// outstanding. So any row of it still to come is above the
		// discovery floor, where discovery finds it.
		if ok && f.empty {
			delete(c.members, t)
			continue
		}
		f.end(ok)
	}
}

func (f *floor) end(ok bool) {
	if !ok {
		if f.settling {
			f.pending = append([]pendingFloor{{after: f.settle, xmax: 0}}, f.pending...)
			if len(f.pending) > maxPending {
				f.pending = f.pending[:maxPending]
			}
		}
		f.scanned, f.settling = false, false
		return
	}
	if f.settling && f.scanned {
		f.after = max(f.after, min(f.settle, f.found))
	} else if f.settling {
		// Not read this sweep (left out): the settled finding waits for a
		// sweep that reads the topic.
		f.pending = append([]pendingFloor{{after: f.settle, xmax: 0}}, f.pending...)
		if len(f.pending) > maxPending {
			f.pending = f.pending[:maxPending]
		}
	}
	if f.scanned {
		f.unstamped, f.hasUnstamped = f.found, true
	}
	f.scanned, f.settling = false, false
}

// sweepMarks gathers, during one sweep, how far each topic it read was dealt
// with: reach is the last id its pages read (its floor if none), left the id
// before the first row it left outstanding (read but held elsewhere, or
// claimed and not sent). Topics not in reach were not read.
//
// A sweep's lanes note their pages at once: mu guards reach and left.
type sweepMarks struct {
	mu          sync.Mutex
	reach, left map[string]int64
	// off says the sweep's findings are not kept (a broker trial's sweep,
	// whose claims do not follow the pages).
	off bool
}

func newSweepMarks(floors map[string]int64) *sweepMarks {
	return &sweepMarks{reach: floors, left: map[string]int64{}}
}

// paged notes what a page found of topic t: it read up to f.last, and with
// held set it left some of what it read (held elsewhere) from f.first on. A
// nil m notes nothing.
func (m *sweepMarks) paged(t string, f pageTopic, held bool) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.reach[t]; !ok {
		return
	}
	m.reach[t] = max(m.reach[t], f.last)
	if held {
		m.noteLeft(t, f.first)
	}
}

// leave notes that row id of topic stays outstanding after the sweep.
func (m *sweepMarks) leave(topic string, id int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.noteLeft(topic, id)
}

func (m *sweepMarks) noteLeft(topic string, id int64) {
	if l, ok := m.left[topic]; !ok || id-1 < l {
		m.left[topic] = id - 1
	}
}

// finish ends the sweep's part of the cursor: ok says the sweep succeeded.
func (c *cursor) finish(ok bool, m *sweepMarks) {
	if ok && m != nil && !m.off {
		for t, reach := range m.reach {
			if l, left := m.left[t]; left {
				reach = min(reach, l)
			}
			c.found(t, reach)
		}
	}
	c.done(ok && m != nil && !m.off)
}

// cursorStats is what the sweep's debug line says of the cursor.
type cursorStats struct {
	Members           int
	Discovery, Lowest int64
	Pending           int
	Xmin              uint64
}

func (c *cursor) stats() cursorStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := cursorStats{Members: len(c.members), Discovery: c.discovery.after, Lowest: c.discovery.after, Xmin: c.xmin,
		Pending: len(c.discovery.pending)}
	for _, f := range c.members {
		st.Lowest = min(st.Lowest, f.after)
		st.Pending = max(st.Pending, len(f.pending))
	}
	return st
}
