package outbox

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
)

// sweepState is what one sweep knows across its topics and pages.
type sweepState struct {
	// stop ends the reading of pages; work, which outlives stop during a
	// graceful shutdown, carries the sends.
	stop, work context.Context
	// gate is the sweep's answer from the gate: which topics may send, which
	// send a trial, which have stopped.
	gate *gatePass
	// trial is set while the sweep sends the half-open broker breaker's one
	// batch: its topic sends that batch and nothing more.
	trial bool
	// page is the page being sent.
	page *page
	// up says the broker is known to be up in this sweep: a send succeeded, or
	// the producer's check passed. down says a check failed and nothing has
	// succeeded since. They are the policy's evidence.
	up, down atomic.Bool
}

func (st *sweepState) evidence() evidence {
	switch {
	case st.up.Load():
		return brokerUp
	case st.down.Load():
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
func (s *Sweeper) sweep(stop, work context.Context, due time.Time, tick bool) (res SweepResult, err error) {
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
			return res, s.expireLeftOut(work, nil, due, &res)
		}
		return res, nil
	}
	pass := s.gate.open(time.Now())
	defer s.gate.close(pass)
	st := &sweepState{stop: stop, work: work, gate: pass}
	excluded := pass.excluded
	if tick {
		if err := s.expireLeftOut(work, excluded, due, &res); err != nil {
			return res, err
		}
	}
	// Each topic is read from its floor (cursor.go), not from its lowest id,
	// so that the sweep never walks again what earlier sweeps sent.
	leftOut := pass.leftOut
	var marks *sweepMarks
	members, floorsIn, discovery, seen, reread := s.cursor.begin(leftOut)
	defer func() { s.cursor.finish(err == nil, marks) }()
	l, err := s.store.liveTopics(work, members, floorsIn, discovery, seen, reread)
	if err != nil {
		return res, fmt.Errorf("list topics with outstanding rows in %s: %w", s.cfg.Table, err)
	}
	floors := s.cursor.listed(l.xmin, l.xmax, l.live, l.empty, l.fresh, l.last, reread, l.cut, l.reread)
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
	live := slices.Sorted(maps.Keys(floors))
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
	began := time.Now()
	// Under OrderingTopic the sweep ends sooner, at the first tick
	// minTopicSweepSpan after it began: its page transactions hold their
	// topics' locks, and a sweep that read on took every topic again the
	// moment it let them go, so other instances never got one
	// (TestThreeInstancesKeepTopicOrderAndSendNothingTwice).
	span := maxSweepSpan
	if s.store.topicLocks {
		span = minTopicSweepSpan
	}
	over := func() bool {
		return !due.IsZero() && !time.Now().Before(due) && (time.Since(began) >= span || stop.Err() != nil)
	}
	tickDue := func() (end bool) {
		if due.IsZero() || time.Now().Before(due) {
			return false
		}
		if over() {
			return true
		}
		s.breaker.OnTick()
		if err := s.expireLeftOut(work, excluded, due, &res); err != nil {
			s.logger.Error("expiring the rows of left-out topics failed; they will be tried at the next tick",
				"table", s.cfg.Table.String(), "err", err)
		}
		due = s.cfg.Schedule.Next(time.Now())
		res.due = due
		return false
	}
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
	var (
		p      *page         // the open page transaction, between its claim and its end
		pages  int           // pages claimed in p
		next   *aheadPage    // the next page, claimed in p while the current one sends
		halted = pass.halted // topics done for this sweep; pass.halt adds to it
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
		var cur *aheadPage
		if next != nil {
			cur, next = next, nil
		} else {
			if live, after = withoutHalted(live, after, halted); len(live) == 0 {
				break
			}
			window, share := s.window(len(live))
			cur = &aheadPage{window: window, share: share}
			if p, cur.msgs, cur.found, err = claimPage(work, s.store, live[:window], after[:window], share); err != nil {
				return res, err
			}
			if p != nil {
				p.left = marks.leave
			}
			pages, read = 0, make(map[string]bool, window)
			for _, t := range live[:window] {
				read[t] = true
			}
		}
		pages++
		done := s.account(cur, &res, marks)
		if len(halted) > 0 { // a page claimed ahead holds rows of topics that stopped since
			cur.msgs = slices.DeleteFunc(cur.msgs, func(m producer.Message) bool { return halted[m.Topic] })
		}
		live, after = advance(live, after, cur, done, halted)
		if p == nil { // nothing claimed: every row read is held elsewhere
			if tickDue() {
				break
			}
			continue
		}
		// While the broker takes this page, the database claims the next in the
		// same transaction (the page's topic locks are this transaction's). A
		// transaction carries at most pagesPerTransaction pages, so that the
		// moves of a drain are committed as it goes.
		var ahead chan error
		if window, share := s.aheadWindow(live, read); window > 0 && pages < pagesPerTransaction && !over() {
			for _, t := range live[:window] {
				read[t] = true
			}
			next = &aheadPage{window: window, share: share}
			ahead = make(chan error, 1)
			go func(topics []string, after []int64) {
				var err error
				next.msgs, next.found, err = p.claimAhead(work, topics, after, share)
				ahead <- err
			}(live[:window], after[:window])
		}
		st.page = p
		stopped, sendErr := s.sendPage(st, cur.msgs, &res)
		st.page = nil
		if ahead != nil {
			if aheadErr := <-ahead; sendErr == nil {
				sendErr = aheadErr
			}
			p.hold(next.msgs) // all of them, so that the page's end leaves those not sent to the cursor
		}
		if sendErr != nil {
			return res, sendErr // the deferred end rolls back
		}
		if s.gate.brokerState() == breaker.DependencyOpen {
			return res, nil // the broker went down during the page
		}
		// Topics that stopped are done for this sweep, in the page claimed
		// ahead too.
		pass.halt(stopped)
		if next == nil {
			err = p.end(work)
			p = nil
			if err != nil {
				return res, err
			}
		}
		if tickDue() {
			break
		}
	}
	return res, nil
}

// maxSweepSpan is how long a sweep that still has rows to read goes on past
// the tick it was due to end at, doing each tick's work as it comes. Past it
// the sweep ends, and the next lists the topics again: topics whose cooldown
// or backoff ended join, new ones are discovered.
const maxSweepSpan = time.Second

// minTopicSweepSpan is how long a sweep under OrderingTopic that still has
// rows to read goes on past its tick: other instances find the topics free
// only between its sweeps (maxSweepSpan), so it ends sooner; but not at every
// tick, whose listing, expiry pass and cold claim took a sixth of a drain at
// --tick 50ms (issue 32).
const minTopicSweepSpan = 200 * time.Millisecond

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
	found         map[string]pageTopic
}

// window returns how many of live topics the next page reads, and the share of
// each. A page reads at most PageSize topics (a share of one each when there
// are more), so the page size bounds memory however many topics there are;
// topics beyond it wait their turn at the back of the queue.
func (s *Sweeper) window(live int) (window, share int) {
	window = min(live, s.cfg.PageSize)
	if s.store.topicLocks {
		window = min(window, maxLockedTopics)
	}
	return window, (s.cfg.PageSize + window - 1) / window
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
	window, share = s.window(len(live))
	if !s.store.topicLocks {
		return window, share
	}
	budget := maxLockedTopics - len(read)
	for i, t := range live[:window] {
		if read[t] {
			continue
		}
		if budget == 0 {
			return i, (s.cfg.PageSize + i - 1) / max(i, 1)
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
		pg := &aheadPage{window: 1, share: s.cfg.PageSize}
		p, msgs, found, err := claimPage(ctx, s.store, live[i:i+1], after[i:i+1], s.cfg.PageSize)
		if err != nil {
			return nil, nil, err
		}
		pg.msgs, pg.found = msgs, found
		s.account(pg, res, nil)
		if p != nil && len(pg.msgs) == 0 { // held elsewhere in part, under OrderingTopic
			p.release(ctx)
			p = nil
		}
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
		sem     = make(chan struct{}, s.cfg.Concurrency)
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
			if t.out.failed || t.out.contended || st.gate.trial(g.topic) {
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
