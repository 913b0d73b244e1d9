package outbox

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
)

// sweepState is what one lane of a sweep (see sweep) knows across its topics
// and pages; what the lanes share is behind its pointers.
type sweepState struct {
	// stop ends the reading of pages: the sweep's stop, or, in a lane, the end
	// of the sweep that another lane's database error or the broker going
	// down brings. work, which outlives stop during a graceful shutdown,
	// carries the sends.
	stop, work context.Context
	// gate is the sweep's answer from the gate: which topics may send, which
	// send a trial, which have stopped.
	gate *gatePass
	// trial is set while the sweep sends the half-open broker breaker's one
	// batch: its topic sends that batch and nothing more.
	trial bool
	// page is the lane's page being sent.
	page *page
	// broker is what the sweep knows of the broker, shared by its lanes.
	broker *brokerSeen
	// sends holds a slot for each topic being sent, Concurrency in all,
	// shared by the sweep's lanes: --concurrency bounds the sends of the
	// process, however many lanes.
	sends chan struct{}
	// yield, with a Host, gives the sweep's turn back between pages, while
	// other outboxes wait, and returns when the sweep has its next turn
	// (false: the sweeper is stopping, and holds no turn). Nil (Sweep):
	// the sweep ends at such a page instead.
	yield func(SweepResult) bool
}

// brokerSeen is a sweep's evidence of the broker, the policy's: up says the
// broker is known to be up in this sweep (a send succeeded, or the producer's
// check passed); down says a check failed and nothing has succeeded since.
type brokerSeen struct{ up, down atomic.Bool }

// forget drops the evidence: the next failure asks the producer's check.
func (b *brokerSeen) forget() {
	b.up.Store(false)
	b.down.Store(false)
}

func (st *sweepState) evidence() evidence {
	switch {
	case st.broker.up.Load():
		return brokerUp
	case st.broker.down.Load():
		return brokerDown
	default:
		return brokerUnknown
	}
}

// sweep runs one sweep, a tick's (which first advances the topic breaker's
// cooldowns) or a wake-up's: lists the topics with outstanding rows that the topic
// breaker and the topic backoff allow, then reads and sends pages while stop is
// live, topics may hold more, and the next tick (due; zero for none) has not
// come. Sends use work, which outlives stop during a graceful shutdown.
//
// A page gives each live topic an equal share, read in id order from where the
// topic's previous page ended, so a deep backlog in one topic cannot fill the
// pages, and every page moves on. Rows left behind (poison, held by another
// sweeper) wait for the next sweep, which starts each topic from its floor: the
// cursor (cursor.go) keeps the floor below every row left outstanding.
// Topics that appear during a tick are read from the next one.
//
// During a drain the live topics are split into lanes (pageLanes), each
// paging its own topics in a page transaction of its own, on a connection of
// its own, at once: see pageLanes for why.
func (s *Sweeper) sweep(stop, work context.Context, due time.Time, tick bool, yield func(SweepResult) bool) (res SweepResult, err error) {
	if tick {
		s.breaker.OnTick()
	}
	// Each tick, rows no page will claim expire on schedule: those of every
	// topic while the broker is down, of the topics left out of paging
	// otherwise, and in every topic those whose own deadline passed.
	//
	// An open broker breaker fails the tick fast: no page, no call to the
	// broker, and the rows keep their attempts.
	if s.gate.brokerState() == breaker.DependencyOpen {
		res.Blocked = true
		if tick {
			return res, s.expireLeftOut(work, nil, true, due, &res)
		}
		return res, nil
	}
	// A page's rows could be sent but never recorded as sent without the
	// history table: sent again at every sweep. Retention's Prepare refuses
	// the start on it, but a relay that started while the database was
	// down, or a tenant's schema made again from an old dump, met it only
	// at the moves, every page rolled back after its sends (an independent
	// review).
	if !s.historyFound.Load() {
		found, err := s.store.findHistory(work)
		if err != nil {
			return res, err
		}
		s.historyFound.Store(found)
	}
	pass := s.gate.open(time.Now())
	defer s.gate.close(pass)
	res.retrying = pass.backingOff
	st := &sweepState{stop: stop, work: work, gate: pass, broker: &brokerSeen{}, sends: make(chan struct{}, s.cfg.Concurrency), yield: yield}
	excluded := pass.excluded
	if tick {
		if err := s.expireLeftOut(work, excluded, false, due, &res); err != nil {
			return res, err
		}
	}
	// Each topic is read from its floor (cursor.go), not from its lowest id,
	// so that the sweep never walks again what earlier sweeps sent.
	leftOut := pass.leftOut
	var marks *sweepMarks
	if s.cursor.seedable() {
		topics, err := s.store.topics(work, nil)
		if err != nil {
			return res, fmt.Errorf("list topics with outstanding rows in %s: %w", s.cfg.Table, err)
		}
		s.cursor.seed(topics)
	}
	members, floorsIn, discovery, seen, reread := s.cursor.begin(leftOut)
	defer func() { s.cursor.finish(err == nil, marks) }()
	l, err := s.store.liveTopics(work, members, floorsIn, discovery, seen, reread)
	if err != nil {
		return res, fmt.Errorf("list topics with outstanding rows in %s: %w", s.cfg.Table, err)
	}
	floors := s.cursor.listed(l.xmin, l.xmax, l.live, l.empty, l.fresh, l.last, reread, l.cut, l.reread)
	// A half-open topic whose probe found no outstanding row has no trial to
	// send: it closes. It stayed half-open until a row came (its rows
	// expired, or deleted by hand after a flood of bad topics), its alert
	// firing, its series set, a turn of the trials taken each sweep, and,
	// never closed, never forgotten (an independent review, 2026-11-29).
	for _, t := range l.empty {
		if !pass.trial(t) {
			continue
		}
		if e, ok := s.breaker.(breaker.Emptier); ok {
			e.Empty(t, pass.gen(t))
		} else {
			s.breaker.Success(t, pass.gen(t))
		}
	}
	for t := range floors {
		if leftOut[t] {
			delete(floors, t)
		} else if first, ok := l.first[t]; ok && first-1 > floors[t] {
			// Nothing is outstanding between the floor and the first row the
			// listing found: the topic's first page starts there rather than
			// walk again what the probe walked.
			floors[t] = first - 1
		}
	}
	live := s.inLine(slices.Sorted(maps.Keys(floors)))
	// Idle: no topic holds a row, and none is held back (a held topic has
	// cooldown ticks to count, or rows to expire).
	res.Idle = len(live) == 0 && len(leftOut) == 0 && len(excluded) == 0 && !l.cut
	if live, err = s.leaveOutUnreachable(work, pass, live); err != nil {
		return res, err
	}
	after := make([]int64, len(live))
	for i, t := range live {
		after[i] = floors[t]
	}
	marks = newSweepMarks(floors)
	// A tick that comes while topics still have rows is done here, and the
	// sweep reads on, for up to maxSweepSpan: ending the sweep at each tick
	// committed the page, listed the topics again and claimed the next page
	// cold, and a short --tick slowed a drain by a third (issue 32). The
	// cooldowns still count every tick; a topic whose cooldown ends waits
	// for the next sweep, at most maxSweepSpan.
	//
	// Under OrderingTopic too: its page transactions hold their topics'
	// locks, so other instances find a topic free only between its sweeps,
	// as they do at the default tick. It once ended at every tick for that
	// reason, then at the first tick 200 ms in; --tick 50ms drained at 0.84
	// to 0.88 of the default tick even so (listing, expiry pass and cold
	// claims in both lanes every 200 ms), and at 0.97 to 1.21 with the same
	// span as OrderingNone (soak ceilings, issue 32), while
	// TestThreeInstancesKeepTopicOrderAndSendNothingTwice still finds every
	// instance sending, beside two CPU hogs too.
	ticks := &sweepTicks{s: s, stop: stop, work: work, excluded: excluded, due: due, began: time.Now(), span: maxSweepSpan}
	// A half-open broker breaker lets a single trial through and refuses the
	// others: send one batch alone first, rather than claim batches only to
	// have them refused, and sweep on only if it closed the breaker. The tried
	// topic sits out the rest of the sweep: it had its batch, and its outcome
	// is in.
	if s.gate.brokerState() == breaker.DependencyHalfOpen && len(live) > 0 {
		marks.off = true // the trial's claims do not follow the pages
		i, p, msgs, err := s.trialClaim(work, live, after, &res)
		if err != nil || p == nil {
			return res, err
		}
		st.trial = true
		_, err = s.sendClaimed(st, p, msgs, &res)
		st.trial = false
		if err != nil || s.gate.brokerState() != breaker.DependencyClosed {
			return res, err
		}
		live = slices.Delete(live, i, i+1)
		after = slices.Delete(after, i, i+1)
	}
	// The listing knows of no outstanding row above the highest id discovery
	// has read (seen, or what it read now), nor below the first rows its
	// probes found.
	lanes := s.laneCount(live, after, l.first, max(seen, l.last))
	err = s.runLanes(st, ticks, marks, live, after, lanes, &res)
	return res, err
}

// pageLanes is how many page transactions a drain's sweep runs at once, each
// with its own share of the live topics (a topic in one lane only, so under
// OrderingTopic its lock is that lane's transaction's and the lanes never
// contend), on a connection of its own.
//
// Why: a drain was bound by one connection. Of a 1.4 s drain of 100,000 rows
// (10 topics, 512-byte payloads, the stdout producer), the page
// transaction's connection was busy 87 % of the time: the claims 0.6-0.8 s,
// the pages' ends (the move of the sent rows to history and the COMMIT)
// 0.4-0.55 s, while the sends (0.5 s) mostly overlapped them and the
// machine sat 40 % idle. A row costs the database a claim, a lock, a
// DELETE and an INSERT, about 1.3 times the single UPDATE of a minimal
// table's claim-and-mark, so on one connection the drain could not pass
// 0.7 of that table's rate (issue 32 asks for 0.8). Two lanes let the
// database work on two rows at once; the sends of one lane never wait for
// the other's page. Measured (BENCHMARKS.md, "Two page lanes"; five runs a
// binary, alternating): the drain went from 0.66 to 0.82 of the ceiling at
// the default tick (1.28 times the rate), and from 0.67 to 0.71 at --tick
// 50ms (1.17 times) while sweeps under OrderingTopic still ended 200 ms in:
// each sweep ends only when both lanes have, so short sweeps cost lanes
// more (they now read on for maxSweepSpan). More lanes than cores buy nothing, and each holds a connection (the
// binary's pool counts them).
const pageLanes = 2

// laneCount returns how many lanes the sweep's pages run in: s.lanes (at
// most one a topic) when at least two topics are live and their outstanding
// rows may fill more than a page (the ids between the lowest start and
// highest, the highest id the listing knows of, bound their number); one
// otherwise, so that a sweep that finds a page or less pays for one
// transaction, not one a lane.
//
// The lowest start is that of the topics whose first outstanding row the
// listing's probe found (first), where their pages start. A topic new to the
// cursor starts at the discovery floor, which trails the sweeps by up to a
// second of rows: at 3,000 rows/s a topic let go and found again made every
// small sweep look like a drain, and two lanes for a few dozen rows doubled
// the claims and commits (the soak's hold: delivery p99 8 ms became 0.25 s).
// Only when no topic was probed (the first sweep, a reset) do the floors
// count.
func (s *Sweeper) laneCount(live []string, after []int64, first map[string]int64, highest int64) int {
	if s.lanes < 2 || len(live) < 2 {
		return 1
	}
	lowest, probed := int64(math.MaxInt64), false
	for i, t := range live {
		if _, ok := first[t]; ok {
			lowest, probed = min(lowest, after[i]), true
		}
	}
	if !probed {
		lowest = slices.Min(after)
	}
	if highest-lowest <= int64(s.cfg.PageSize) {
		return 1
	}
	return min(s.lanes, len(live))
}

// runLanes splits the live topics into n lanes, round robin in name order,
// and runs each lane's page loop (pageLane) at once, each with a sweepState
// of its own (its page) over the sweep's shared evidence and send slots, and
// a result of its own, added to res at the end. A lane that fails (a
// database error) or finds the broker down ends the sweep for the others: they
// stop as a graceful stop does (no batch begins; those in flight finish, and
// each page ends with what it sent). It returns the first lane's error.
func (s *Sweeper) runLanes(st *sweepState, ticks *sweepTicks, marks *sweepMarks, live []string, after []int64, n int, res *SweepResult) error {
	defer ticks.finish(res)
	if n <= 1 {
		return s.pageLane(st, ticks, marks, live, after, res)
	}
	stop, end := context.WithCancel(st.stop)
	defer end()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		first   error
		results = make([]SweepResult, n)
	)
	for i := range n {
		var laneLive []string
		var laneAfter []int64
		for j := i; j < len(live); j += n {
			laneLive, laneAfter = append(laneLive, live[j]), append(laneAfter, after[j])
		}
		lane := &sweepState{stop: stop, work: st.work, gate: st.gate, broker: st.broker, sends: st.sends}
		wg.Go(func() {
			err := s.pageLane(lane, ticks, marks, laneLive, laneAfter, &results[i])
			if err != nil || s.gate.brokerState() == breaker.DependencyOpen {
				end()
			}
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, r := range results {
		res.merge(r)
	}
	return first
}

// pageLane reads and sends pages of topics live, each read after its entry in
// after, while st.stop is live, topics may hold more, and the sweep is not
// over (ticks), adding to res. It is the sweep's only page loop, or one of
// its lanes'.
func (s *Sweeper) pageLane(st *sweepState, ticks *sweepTicks, marks *sweepMarks, live []string, after []int64, res *SweepResult) (err error) {
	stop, work := st.stop, st.work
	var (
		p      *page               // the open page transaction, between its claim and its end
		pages  int                 // pages claimed in p
		next   *aheadPage          // the next page, claimed in p while the current one sends
		halted = map[string]bool{} // the lane's topics done for this sweep
		// read holds the topics p's pages have read: under OrderingTopic,
		// those whose locks p may hold.
		read map[string]bool
	)
	defer func() {
		if p != nil { // an early return: err is already set, or the sweep ends
			if endErr := p.end(work); err == nil {
				err = endErr
			}
		}
	}()
	for stop.Err() == nil {
		// A topic tripped since the plan claims no page more, and its rows
		// in the page claimed ahead stay outstanding (below).
		st.gate.haltTripped(live, halted)
		var cur *aheadPage
		if next != nil {
			cur, next = next, nil
		} else {
			if live, after = withoutHalted(live, after, halted); len(live) == 0 {
				break
			}
			window, share := s.window(len(live), s.pageSize())
			cur = &aheadPage{window: window, share: share}
			if p, cur.msgs, cur.found, err = claimPage(work, s.store, live[:window], after[:window], share); err != nil {
				return err
			}
			if p != nil {
				p.left, p.resent = marks.leave, s.resentRolledBack
			}
			pages, read = 0, make(map[string]bool, window)
			for _, t := range live[:window] {
				read[t] = true
			}
		}
		pages++
		s.claimed(cur.msgs)
		done := s.account(cur, res, marks)
		if len(halted) > 0 { // a page claimed ahead holds rows of topics that stopped since
			cur.msgs = slices.DeleteFunc(cur.msgs, func(m producer.Message) bool { return halted[m.Topic] })
		}
		live, after = advance(live, after, cur, done, halted)
		if p == nil { // nothing claimed: every row read is held elsewhere
			if ticks.tick(res) {
				break
			}
			continue
		}
		// While the broker takes this page, the database claims the next in the
		// same transaction (the page's topic locks are this transaction's). A
		// transaction carries at most pagesPerTransaction pages, so that the
		// moves of a drain are committed as it goes.
		var ahead chan error
		if window, share := s.aheadWindow(live, read); window > 0 && pages < pagesPerTransaction && !ticks.over() && !s.yielding() {
			for _, t := range live[:window] {
				read[t] = true
			}
			next = &aheadPage{window: window, share: share}
			ahead = make(chan error, 1)
			go func(topics []string, after []int64) {
				var err error
				next.msgs, next.tids, next.found, err = p.claimAhead(work, topics, after, share)
				ahead <- err
			}(live[:window], after[:window])
		}
		st.page = p
		stopped, sendErr := s.sendPage(st, cur.msgs, res)
		st.page = nil
		if ahead != nil {
			if aheadErr := <-ahead; sendErr == nil {
				sendErr = aheadErr
			}
			p.hold(next.msgs, next.tids) // all of them, so that the page's end leaves those not sent to the cursor
		}
		if sendErr != nil {
			return sendErr // the deferred end rolls back
		}
		if s.gate.brokerState() == breaker.DependencyOpen {
			return nil // the broker went down during the page
		}
		// Topics that stopped are done for this sweep, in the page claimed
		// ahead too. The gate hears of them, for Gates.
		for _, t := range stopped {
			halted[t] = true
		}
		st.gate.halt(stopped)
		if next == nil {
			err = p.end(work)
			p = nil
			if err != nil {
				return err
			}
			if len(live) > 0 && s.yielding() {
				// Other outboxes want a turn: this one's next page comes at
				// its next turn, behind theirs. The sweep goes on from where
				// it is: ending it would list the topics again, and run a
				// tick's expiry pass, at every page of a busy tenant. A
				// sweep with nothing left ends instead, its turn given back.
				sofar := *res
				sofar.more = true
				if st.yield == nil || !st.yield(sofar) {
					break
				}
			}
		}
		if ticks.tick(res) {
			res.more = len(live) > 0 // the span ran out mid-drain
			if res.more {
				s.cutAt(live[0])
			}
			break
		}
	}
	return nil
}

// cutAt notes topic as the one a lane cut short by the sweep's span was
// about to page next; of several lanes', the least by name.
func (s *Sweeper) cutAt(topic string) {
	n := &s.nextInLine
	n.Lock()
	defer n.Unlock()
	if !n.set || topic < n.topic {
		n.topic, n.set = topic, true
	}
}

// inLine returns live, sorted by name, turned to begin at the topic the last
// sweep was about to page when its span ran out (cutAt), or as it is. Every
// sweep paged from the first topic by name: while more topics held rows than
// one sweep's span pages, those late in name order waited as long as the
// earlier ones kept rows (an independent review).
func (s *Sweeper) inLine(live []string) []string {
	n := &s.nextInLine
	n.Lock()
	from, set := n.topic, n.set
	n.topic, n.set = "", false
	n.Unlock()
	if !set {
		return live
	}
	i, _ := slices.BinarySearch(live, from)
	return append(live[i:len(live):len(live)], live[:i]...)
}

// yielding says other outboxes' sweepers wait for a turn (Config.Host).
func (s *Sweeper) yielding() bool {
	return s.cfg.Host != nil && s.cfg.Host.Waiting()
}

// sweepTicks is a sweep's schedule as it reads on past the tick it was due to
// end at: the next tick, and each tick's work, done once whichever lane
// comes to it first.
type sweepTicks struct {
	s          *Sweeper
	stop, work context.Context
	excluded   []string // the topics left out of paging, whose rows expire each tick
	began      time.Time
	span       time.Duration // maxSweepSpan
	// working serializes the ticks' work; mu guards due (the next tick, zero
	// for none) and advanced (due is a tick the sweep read on to).
	working  sync.Mutex
	mu       sync.Mutex
	due      time.Time
	advanced bool
}

// over says the sweep ends now: the next tick has come, and the sweep has
// read on for its span, or is stopping.
func (t *sweepTicks) over() bool {
	t.mu.Lock()
	due := t.due
	t.mu.Unlock()
	return t.overAt(due)
}

func (t *sweepTicks) overAt(due time.Time) bool {
	return !due.IsZero() && !time.Now().Before(due) && (time.Since(t.began) >= t.span || t.stop.Err() != nil)
}

// tick does a tick's work if the next tick has come and the sweep reads on
// past it: the topic breaker's OnTick and the expiry of the left-out topics'
// rows (added to res), once per tick, by the first lane to come to it. It
// reports whether the sweep is over instead.
func (t *sweepTicks) tick(res *SweepResult) (end bool) {
	t.mu.Lock()
	due := t.due
	if due.IsZero() || time.Now().Before(due) {
		t.mu.Unlock()
		return false
	}
	if t.overAt(due) {
		t.mu.Unlock()
		return true
	}
	t.due, t.advanced = t.s.cfg.Schedule.Next(time.Now()), true
	t.mu.Unlock()
	t.working.Lock()
	defer t.working.Unlock()
	s := t.s
	s.breaker.OnTick()
	if err := s.expireLeftOut(t.work, t.excluded, false, due, res); err != nil && !s.dropped(t.work, err) {
		s.logger.Error("expiring the rows of left-out topics failed; they will be tried at the next tick",
			"table", s.cfg.Table.String(), "err", err)
	}
	return false
}

// finish gives res the next tick, if the sweep read on past its own.
func (t *sweepTicks) finish(res *SweepResult) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.advanced {
		res.due = t.due
	}
}

// maxSweepSpan is how long a sweep that still has rows to read goes on past
// the tick it was due to end at, doing each tick's work as it comes. Past it
// the sweep ends, and the next lists the topics again: topics whose cooldown
// or backoff ended join, new ones are discovered.
const maxSweepSpan = time.Second

// pagesPerTransaction bounds the pages one transaction claims, one ahead of
// another while the previous sends. More pages a transaction keep the database
// and the broker busy at once for longer; fewer commit a drain's progress
// sooner and resend less after a crash (a transaction's rows are sent again
// if it never commits).
const pagesPerTransaction = 8

// aheadPage is a claimed page: its rows, what it found of each topic, and the
// window and share it was read with.
type aheadPage struct {
	window, share int
	msgs          []producer.Message
	tids          []pgtype.TID // where each of msgs was locked
	found         map[string]pageTopic
}

// window returns how many of live topics a page of size rows (pageSize)
// reads, and the share of each. A page reads at most size topics (a share of
// one each when there are more), so the page size bounds memory however many
// topics there are; topics beyond it wait their turn at the back of the queue.
func (s *Sweeper) window(live, size int) (window, share int) {
	window = min(live, size)
	if s.store.topicLocks {
		window = min(window, maxLockedTopics)
	}
	return window, (size + window - 1) / window
}

// pageSize is the most rows the next page reads: PageSize, or less while a
// PagingHost limits pages.
func (s *Sweeper) pageSize() int {
	if h, ok := s.cfg.Host.(PagingHost); ok {
		if n := h.PageLimit(); n > 0 && n < s.cfg.PageSize {
			return n
		}
	}
	return s.cfg.PageSize
}

// aheadWindow returns how many of live topics the page claimed ahead in a
// transaction reads, and the share of each: as window, but under
// OrderingTopic only as many topics as keep the transaction's locks (one for
// each topic read, the topics its pages have read) within maxLockedTopics. The
// topics that would go past it wait for the next transaction, which begins
// with them.
func (s *Sweeper) aheadWindow(live []string, read map[string]bool) (window, share int) {
	if len(live) == 0 {
		return 0, 0
	}
	size := s.pageSize()
	window, share = s.window(len(live), size)
	if !s.store.topicLocks {
		return window, share
	}
	budget := maxLockedTopics - len(read)
	for i, t := range live[:window] {
		if read[t] {
			continue
		}
		if budget == 0 {
			return i, (size + i - 1) / max(i, 1)
		}
		budget--
	}
	return window, share
}

// advance returns the topics that page on after page pg, which read the first
// pg.window of live: the topics that waited, then those of the page that read
// a full share (more may be behind it) and are not done; none halted; each
// with the id its next page starts after.
func advance(live []string, after []int64, pg *aheadPage, done, halted map[string]bool) ([]string, []int64) {
	next := make([]string, 0, len(live))
	nextAfter := make([]int64, 0, len(live))
	for i, t := range live[pg.window:] {
		if !halted[t] {
			next, nextAfter = append(next, t), append(nextAfter, after[pg.window+i])
		}
	}
	for _, t := range live[:pg.window] {
		f, paged := pg.found[t]
		if !paged || done[t] || halted[t] || f.candidates < pg.share {
			continue // drained (nothing in this page), stopped, or short
		}
		next, nextAfter = append(next, t), append(nextAfter, f.last)
	}
	return next, nextAfter
}

// withoutHalted returns live, and its after, without the halted topics.
func withoutHalted(live []string, after []int64, halted map[string]bool) ([]string, []int64) {
	if len(halted) == 0 {
		return live, after
	}
	keep := 0
	for i, t := range live {
		if !halted[t] {
			live[keep], after[keep] = t, after[i]
			keep++
		}
	}
	return live[:keep], after[:keep]
}

// maxLockedTopics bounds the topics of a page's transaction under
// OrderingTopic (its pages claimed ahead included), which holds each one's
// advisory lock: Postgres keeps them in a
// lock table shared by every session, of max_locks_per_transaction ×
// max_connections entries (6,400 by default), and a transaction that finds it
// full fails ("out of shared memory").
const maxLockedTopics = 256

// maxTrialCandidates bounds the topics claimed to find a trial batch.
const maxTrialCandidates = 8

// account counts claimed page pg in res. Rows another transaction holds were
// skipped; under OrderingTopic a topic that did not get all it read sends none
// of it (nothing may overtake a row in flight elsewhere): account leaves their
// rows out of pg.msgs (the page's end leaves them outstanding) and returns those
// topics, done for this sweep. It tells marks (nil for none) how far each
// topic was read, before any row is left out.
func (s *Sweeper) account(pg *aheadPage, res *SweepResult, marks *sweepMarks) (done map[string]bool) {
	res.Pages++
	done = make(map[string]bool)
	claimed := make(map[string]int, len(pg.found))
	for _, m := range pg.msgs {
		claimed[m.Topic]++
	}
	for t, f := range pg.found {
		marks.paged(t, f, claimed[t] < f.candidates)
		if n := claimed[t]; n < f.candidates {
			res.Skipped += f.candidates - n
			if s.cfg.Ordering == OrderingTopic {
				done[t] = true
			}
		}
	}
	if len(done) > 0 {
		pg.msgs = slices.DeleteFunc(pg.msgs, func(m producer.Message) bool { return done[m.Topic] })
	}
	return done
}

// trialClaim claims the page the half-open broker breaker's trial is taken
// from: the next topic in turn, so one topic whose batch fails by itself
// cannot be the only trial there ever is; and among the next few, the first
// whose oldest row has never failed, so the trial does not fall on a row
// already known to fail alone (failing that, the first that had rows to
// claim). It returns the topic's index in live, the page (nil when no topic
// had a row to claim) and its rows.
func (s *Sweeper) trialClaim(ctx context.Context, live []string, after []int64, res *SweepResult) (int, *page, []producer.Message, error) {
	// Each claim is counted in res (see account), which leaves out the rows
	// of topics done.
	claim := func(i int) (*page, []producer.Message, error) {
		size := s.pageSize()
		pg := &aheadPage{window: 1, share: size}
		p, msgs, found, err := claimPage(ctx, s.store, live[i:i+1], after[i:i+1], size)
		if err != nil {
			return nil, nil, err
		}
		pg.msgs, pg.found = msgs, found
		s.account(pg, res, nil)
		if p != nil && len(pg.msgs) == 0 { // held elsewhere in part, under OrderingTopic
			p.release(ctx)
			p = nil
		}
		s.claimed(pg.msgs)
		return p, pg.msgs, nil
	}
	start := int(s.probes.Add(1)-1) % len(live)
	first := -1
	for k := range min(len(live), maxTrialCandidates) {
		i := (start + k) % len(live)
		p, msgs, err := claim(i)
		if err != nil {
			return 0, nil, nil, err
		}
		if p == nil {
			continue
		}
		if msgs[0].Attempts == 0 {
			return i, p, msgs, nil
		}
		p.release(ctx) // claimed again below if no better one comes
		if first < 0 {
			first = i
		}
	}
	if first < 0 {
		return 0, nil, nil, nil
	}
	p, msgs, err := claim(first)
	return first, p, msgs, err
}

// sendClaimed sends the rows of claimed page p and ends the page, adding to
// res. It returns the topics that stopped for the rest of the sweep.
func (s *Sweeper) sendClaimed(st *sweepState, p *page, msgs []producer.Message, res *SweepResult) ([]string, error) {
	st.page = p
	stopped, err := s.sendPage(st, msgs, res)
	st.page = nil
	if endErr := p.end(st.work); err == nil {
		err = endErr
	}
	return stopped, err
}

// sendPage sends the rows msgs of page st.page, its topics concurrently, adding
// to res; rows past their deadline go to the dead-letter table instead. It
// returns the topics that stopped for the rest of the sweep.
func (s *Sweeper) sendPage(st *sweepState, msgs []producer.Message, res *SweepResult) ([]string, error) {
	msgs, moved, err := s.expireRows(st, msgs)
	if err != nil {
		return nil, err
	}
	res.add(moved)
	groups := groupByTopic(msgs)
	var (
		mu      sync.Mutex
		dbErr   error
		stopped []string
		wg      sync.WaitGroup
		sem     = st.sends // shared by the sweep's lanes
	)
	for _, g := range groups {
		if st.stop.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			t := s.topicSender(st, g.topic)
			err := t.send(g)
			mu.Lock()
			defer mu.Unlock()
			res.add(t.out)
			if t.out.failed || t.out.contended || t.out.tripped || st.gate.trial(g.topic) {
				stopped = append(stopped, g.topic)
			}
			if err != nil && dbErr == nil {
				dbErr = err
			}
		})
	}
	wg.Wait()
	return stopped, dbErr
}

type topicGroup struct {
	topic string
	msgs  []producer.Message
}

// groupByTopic splits msgs by topic, keeping id order within each topic and
// ordering the topics by their first row.
func groupByTopic(msgs []producer.Message) []topicGroup {
	index := make(map[string]int)
	var groups []topicGroup
	for _, m := range msgs {
		i, ok := index[m.Topic]
		if !ok {
			i = len(groups)
			index[m.Topic] = i
			groups = append(groups, topicGroup{topic: m.Topic})
		}
		groups[i].msgs = append(groups[i].msgs, m)
	}
	return groups
}
