package outbox

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
)

// SweepResult counts what one sweep did.
type SweepResult struct {
	// Pages is how many pages were read.
	Pages int
	// Dispatched is how many rows the broker accepted and were moved to the
	// history table.
	Dispatched int
	// Batches and FailedBatches count the sends made and those that failed.
	Batches, FailedBatches int
	// Skipped is how many paged rows were left for a later sweep because another
	// sweeper had part of their batch in flight, or had dispatched it meanwhile.
	Skipped int
	// FailedTopics lists the topics that stopped for this sweep after a failed
	// batch, in the order they failed.
	FailedTopics []string
	// Blocked says the dependency breaker was open: the sweep read nothing.
	Blocked bool
	// Idle says the outbox held no outstanding row and no topic was held
	// back: until a row is written, a tick has nothing to do (a sweeper
	// with a Host parks).
	Idle bool
	// AttemptedRows counts the rows that failed alone while the broker was up
	// and counted an attempt.
	AttemptedRows int
	// Splits counts the failed batches that were split to find their bad rows.
	Splits int
	// DeadLettered counts the rows moved to the dead-letter table, Expired
	// among them those past their deadline.
	DeadLettered, Expired int
	// due is when the next tick comes, when the sweep did ticks' work as it
	// read on past them (zero: the tick it was given).
	due time.Time
	// more says the sweep ended with topics still holding rows to read: its
	// span ran out mid-drain. The next sweep resumes the drain (Host.Take).
	// A result given at a yield (Host.Take's done, between pages) has it set
	// too.
	more bool
	// retrying says topics were left out to wait out a backoff after failed
	// batches: their rows are sent at a later sweep.
	retrying bool
}

// More reports whether the sweep left rows to read: it gave its turn back
// between pages with more to send (the result given to Host.Take's done
// then), or its span ran out mid-drain. A host tells a drain's first page
// from a quiet outbox's few rows by it.
func (r SweepResult) More() bool { return r.more }

// Host is what a sweeper gets from a process that runs the sweepers of many
// outboxes on one database (package fleet implements it). Such a process
// cannot give each outbox a LISTEN session, a tick and a share of the pool
// of its own: a thousand tenants' schemas would cost a thousand sessions and
// a thousand idle sweeps a second. So the host listens once for all of them
// and wakes the outbox a commit names, and the sweeper parks (no tick, no
// query) while its outbox holds nothing; the host's reconciliation, at a slow
// pace, wakes the outboxes a lost notification would leave behind.
type Host interface {
	// Wake signals when the outbox may hold rows the sweeper has not seen:
	// a commit to it, or the host's reconciliation finding rows in it.
	Wake() <-chan struct{}
	// Take waits for the sweeper's turn to sweep, and returns the function
	// that ends it, given what the sweep did (so far, when the sweep gives
	// its turn back to go on later; see Waiting). The host bounds the sweeps at
	// once, so that the connections they hold (each up to three) never
	// exceed its pool; the result tells it which outboxes moved rows, the
	// ones whose maintenance is due (an idle or failed sweep moved none).
	// resume says the sweep gave its turn back between pages and goes on:
	// the host may put it behind sweeps that are starting, so that a quiet
	// outbox's few rows do not wait for, nor run beside, a drain's pages.
	Take(ctx context.Context, resume bool) (done func(SweepResult), err error)
	// Waiting reports whether the sweep, having sent a page, should let
	// other sweeps go first: others wait for a turn, or are starting. A
	// sweep then claims no page ahead, and after its page transaction, with
	// rows left, gives its turn back and takes it again with resume set:
	// pages are shared among busy outboxes as a page is shared among
	// topics. The sweep itself goes on (its listing of topics holds), so a
	// busy outbox pays for one listing, not one a page.
	Waiting() bool
}

// PagingHost is a Host that reads smaller pages than Config.PageSize at
// times: a drain's page is a burst of work for the database and the process
// (its claim, its sends, its move to history), and the host's other outboxes'
// sweeps that run beside it wait on the machine for as long as it lasts. A
// host whose quiet outboxes sweep beside a drain keeps those bursts short
// (ADR 0002).
type PagingHost interface {
	Host
	// PageLimit returns the most rows the next page may read, or 0 for
	// Config.PageSize. The sweeper asks before each page it claims.
	PageLimit() int
}

// ListingHost is a Host that finds its outboxes by listing them (the tenant
// schemas of a fleet), so that one can be dropped while its sweeper runs:
// between a drop and the host's next listing, a sweep that was awake (or due
// to read its cursor again, or woken by a commit in flight) finds no table.
// That sweep tells the host, which lists again at once and stops the
// sweeper, and the failure is logged as what it is: not an ERROR that asks
// an operator to migrate the tenant they have just dropped, again at each
// retry until the next listing.
type ListingHost interface {
	Host
	// Gone says a sweep failed because the outbox table no longer exists.
	Gone()
}

// AsideHost is a Host told of the rows a sweeper dead-lettered outside a
// sweep, which no sweep's result carries: the floors' check moving rows whose
// id is not positive aside (invalid_id). A host that maintains the outboxes
// whose sweeps moved rows (their dead-letter probe) counts these too, or
// their dead letters went untold.
type AsideHost interface {
	Host
	DeadLetteredAside(n int)
}

// AwakeHost is a Host that keeps its outboxes' awake locks on a session of
// its own, the one it LISTENs on (Listener.AwakeLock): a sweeper of its own
// opens a connection for its lock, which a host of a thousand outboxes could
// not afford. Without it, every commit to a host's outbox notifies, and a
// busy one's commits queue for Postgres's notify lock (migration 6).
type AwakeHost interface {
	Host
	// AwakeLock returns the outbox's awake lock.
	AwakeLock() AwakeLock
	// Busy reports whether the outbox's commits come fast enough for its
	// sweeper to wake up when they press it (a commit notified during a
	// sweep), or, awake, to stay so. A sweeper of its own stays awake
	// whenever pressed; a host pays for every awake sweeper's polling (a
	// sweep every few milliseconds, each in a turn), and ten tenants at 50
	// commits a second each, pressed now and then on a busy machine, polled
	// more than their notifications cost. The sweeper asks after each
	// sweep; dispatched is the rows that sweep sent: while the lock is held
	// commits do not notify, and the rows sent are what tells their rate.
	Busy(dispatched int) bool
}

// Sweeper relays outstanding outbox rows to a producer.
//
// A sweep reads a page of outstanding rows in id order, groups it by topic
// keeping that order, lets the producer cut each group into batches, and sends up
// to Concurrency topics at once, the batches of one topic in order. A page is
// claimed in one transaction that holds its rows' locks while its batches are
// sent, and each batch's outcome is its own: only the rows the broker accepted
// move to the history table at the page's end (page.go), so a later failure
// never undoes an earlier success and a second sweeper on the
// same table never sends a row this one has in flight. What a failed batch means
// for its rows, its topic and the broker is the failure policy's to say
// (policy.go): a batch that fails while the broker is up is split until the
// failing rows stand alone, and only those count an attempt; other topics go
// on. While pages come back full, the sweep reads the next page at once, so a
// backlog drains at the database's pace, not the tick's.
type Sweeper struct {
	breaker breaker.Breaker
	broker  BrokerBreaker // nil: none
	backoff *topicBackoff
	// gate says whether a topic may send now, and why not (gate.go).
	gate *gate
	// progress is beaten by every statement and every send; Stalled reads it.
	progress *heartbeat
	activity activity
	cfg      Config
	logger   *slog.Logger
	producer producer.Producer
	store    *store
	// probes counts the trials of a half-open broker breaker, to take each
	// from the next topic: one topic whose batch fails by itself must not be
	// the only trial there ever is.
	probes atomic.Uint64
	// busySince is when Run's current sweep began (Unix nanoseconds), 0
	// while it waits for the next; lastSweep, when its last sweep ended.
	// Stalled reads them.
	busySince, lastSweep atomic.Int64
	// cursor keeps each topic's floor across sweeps.
	cursor *cursor
	// failing is Run's sweeps that failed one after another, nil while the
	// last one succeeded. Failing reads it.
	failing atomic.Pointer[SweepFailure]
	// lanes is how many page transactions a drain's sweep runs at once:
	// pageLanes, fewer if the pool is too small to hold them and one more
	// connection (the tick's expiry pass).
	lanes int
	// parked says Run waits for a wake-up alone, with no tick: its last
	// sweep found the outbox idle (only with a Host).
	parked atomic.Bool
	// parkChanged is signalled when parked is set or cleared, for the
	// floors' check, which stops its ticker while parked (checkFloors).
	parkChanged chan struct{}
	// woken is set from a parked sweeper's wake-up until the sweep it woke
	// for ends (parked still holds the sweep before's finding meanwhile).
	// Asleep reads it.
	woken atomic.Bool
	// tableGone says a statement found the outbox table dropped and the
	// host was told (dropped), until a sweep succeeds again.
	tableGone atomic.Bool
	// nextInLine is the topic a sweep cut short by its span was about to
	// page next (the least of its lanes'): the next sweep pages from it
	// (sweep.go's inLine), so that topics late in name order are not left
	// waiting while earlier ones keep rows.
	nextInLine struct {
		sync.Mutex
		topic string
		set   bool
	}
	// historyFound says the history table was found since the sweeper began,
	// or since Recheck (a table made again may lack it): until then each
	// sweep looks for it before any page (store.findHistory).
	historyFound atomic.Bool
	// behind is when the oldest row of the last page claimed was written
	// (Unix nanoseconds), kept while the sweep runs and after one that left
	// rows (a drain, a failure); 0 once a sweep ends with none left. Behind
	// reads it.
	behind atomic.Int64
}

// BrokerBreaker is the broker (dependency) circuit breaker as the sweeper
// drives it. breaker.Dependency implements it.
type BrokerBreaker interface {
	// Allow asks to make one send. An error means the breaker refuses: the
	// sweeper sends nothing and releases the rows. Otherwise the sweeper sends
	// and calls done once with its verdict on the broker.
	Allow() (done func(v breaker.Verdict, cause error), err error)
	// State tells whether the breaker is closed, open (the sweeper reads no
	// page) or half-open (it sends one batch alone).
	State() breaker.DependencyState
}

// NewSweeper returns a sweeper over pool's outbox table cfg.Table, sending to p.
// It reports an invalid configuration. Sweeping takes one of the pool's
// connections for the topic list, then one for each page transaction in
// flight: one, or during a drain two at once (the sweep's lanes, sweep.go),
// and one more for a tick's expiry pass while they are open; whatever
// Concurrency: sends use none. A pool of fewer than three connections gets
// one lane, as many as it holds less one.
func NewSweeper(pool *pgxpool.Pool, p producer.Producer, cfg Config) (*Sweeper, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	backoff := newTopicBackoff(cfg.Retry.Initial, cfg.TopicBackoffMax, cfg.Retry.Rand)
	lanes := poolLanes(pool)
	if cfg.Host != nil {
		// The host's outboxes sweep side by side instead, each in one page
		// transaction, so that a sweep holds at most two connections.
		lanes = 1
	}
	progress := &heartbeat{}
	trips, _ := cfg.TopicBreaker.(breaker.TripCounter)
	return &Sweeper{
		progress: progress,
		breaker:  cfg.TopicBreaker,
		broker:   cfg.BrokerBreaker,
		backoff:  backoff,
		gate:     &gate{topics: cfg.TopicBreaker, trips: trips, broker: cfg.BrokerBreaker, backoff: backoff},
		cfg:      cfg,
		logger:   cfg.Logger,
		producer: p,
		store: newStore(pool, cfg.Table, deadLetterPolicy{
			maxAttempts: max(cfg.MaxAttempts, 0),
			stormLimit:  max(cfg.DeadLetterLimit, 0),
			stormWindow: cfg.DeadLetterWindow,
		}, cfg.Ordering, cfg.SendTimeout, progress),
		cursor:      newCursor(cursorResetEvery),
		parkChanged: make(chan struct{}, 1),
		lanes:       lanes,
	}, nil
}

// poolLanes is how many lanes pool's connections allow: pageLanes, and one
// connection to spare for the tick's expiry pass, which runs while the lanes'
// transactions are open.
func poolLanes(pool *pgxpool.Pool) int {
	if pool == nil {
		return 1
	}
	return max(1, min(pageLanes, int(pool.Config().MaxConns)-1))
}

// Run sweeps on the schedule, and on every commit to the outbox unless
// DisableNotify is set, until ctx is done; then it stops reading pages, lets
// batches in flight finish for up to ShutdownTimeout, and returns nil. Database
// errors do not end it: it logs them and tries again with exponential backoff
// (up to 30s), so a database that is down at start or restarts is waited for.
// Run does not close the producer.
func (s *Sweeper) Run(ctx context.Context) error {
	// Sends in flight get their own context, cancelled only ShutdownTimeout after
	// ctx, so that a stop lets them finish and record their outcome.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopGrace := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(s.cfg.ShutdownTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stopGrace()

	var (
		wake  <-chan struct{}
		awake AwakeLock
		busy  = func(int) bool { return true }
	)
	host := s.cfg.Host
	if host != nil {
		wake = host.Wake()
		if ah, ok := host.(AwakeHost); ok {
			awake, busy = ah.AwakeLock(), ah.Busy
			// The host's session outlives this sweeper: a lock left held
			// would keep the outbox's commits from notifying (a schema
			// dropped and made again has the same key).
			defer func() {
				releaseCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), awakeTimeout)
				defer cancel()
				awake.Release(releaseCtx)
			}()
		}
	} else if !s.cfg.DisableNotify {
		var listening func(bool)
		if o, ok := s.cfg.Observer.(ListenObserver); ok {
			listening = o.Listening
		}
		l := newListener(s.store.pool.Config().ConnConfig.Copy(), s.cfg.Table, s.logger, listening)
		listenCtx, stopListening := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { l.run(listenCtx) })
		defer wg.Wait()
		defer stopListening()
		wake = l.wake
		own := newAwakeLock(s.store.pool.Config().ConnConfig.Copy(), s.cfg.Table, s.logger)
		defer own.close()
		awake = own
	}

	// The cursor's floors are checked beside the sweeps (cursor.go).
	checkCtx, stopChecking := context.WithCancel(ctx)
	var checking sync.WaitGroup
	aside := func(int) {}
	if h, ok := s.cfg.Host.(AsideHost); ok {
		aside = h.DeadLetteredAside
	}
	checking.Go(func() { s.cursor.checkFloors(checkCtx, s.store, s.logger, &s.parked, s.parkChanged, aside) })
	defer checking.Wait()
	defer stopChecking()

	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = 500 * time.Millisecond
	retry.MaxInterval = 30 * time.Second
	failing := 0

	level := slog.LevelInfo
	if host != nil {
		level = slog.LevelDebug // a host of a thousand outboxes logs its own line
	}
	s.logger.Log(ctx, level, "sweeper started", "table", s.cfg.Table.String(), "page_size", s.cfg.PageSize,
		"concurrency", s.cfg.Concurrency, "ordering", string(s.cfg.Ordering), "notify", host != nil || !s.cfg.DisableNotify)
	next := time.Now()
	defer s.woken.Store(false) // a sweep woken for may end with ctx
	var st stayAwake
	// draining says the last sweep ended mid-drain: the next takes its turn
	// as a drain's, behind sweeps that start (Host.Take).
	draining := false
	for {
		// While sweeps fail, only the backoff decides when to try again.
		woken := wake
		if failing > 0 {
			woken = nil
		}
		parked := s.parked.Load() && failing == 0
		var polls []time.Time
		if failing == 0 {
			if poll, ok := st.pollAt(); ok {
				polls = append(polls, poll)
			}
			if poll, ok := s.cursor.rereadAt(); ok {
				polls = append(polls, poll)
			}
		}
		at := sweepAt(next, parked, polls...)
		reached, ok := waitFor(ctx, at, woken)
		if !ok {
			s.logger.Info("sweeper stopped")
			return nil
		}
		tick := reached && at.Equal(next) && !parked
		if parked {
			s.woken.Store(true)
		}
		// Whether the transactions to wait out have ended is asked before the
		// sweep, so that the sweep sees whatever they wrote; and before its
		// turn, so that a host's session slow to answer holds up no turn.
		settled := awake == nil || st.settled(work, awake)
		done := func(SweepResult) {}
		if host != nil {
			var err error
			if done, err = host.Take(ctx, draining); err != nil {
				s.logger.Debug("sweeper stopped")
				return nil // ctx is done
			}
		}
		start := time.Now()
		s.busySince.Store(start.UnixNano())
		// A wake-up or a poll sweeps in between ticks: it leaves the cooldowns
		// alone and pages until the next tick is due, as a tick does. One
		// that ends a park sweeps until a tick from now: the tick it parked
		// on is long gone.
		due := next
		if tick || parked {
			due = s.cfg.Schedule.Next(start)
		}
		var yield func(SweepResult) bool
		if host != nil {
			// Waiting for a turn is not being stuck: the stall watch sees
			// the sweep busy from each turn it takes.
			yield = func(sofar SweepResult) bool {
				done(sofar)
				s.busySince.Store(0)
				next, err := host.Take(ctx, true)
				if err != nil {
					done = func(SweepResult) {} // the turn was given back
					return false
				}
				s.busySince.Store(time.Now().UnixNano())
				done = next
				return true
			}
		}
		res, err := s.sweep(ctx, work, due, tick, yield)
		done(res)
		draining = err == nil && res.more
		s.swept(res, err)
		if park := host != nil && err == nil && res.Idle; s.parked.Swap(park) != park {
			select {
			case s.parkChanged <- struct{}{}:
			default: // one is pending already, and is read before parked
			}
		}
		s.woken.Store(false)
		if awake != nil {
			// A notification that came during the sweep says commits come
			// faster than sweeps: the rate at which notifying costs them.
			var sent int
			if err == nil {
				sent = res.Dispatched
			}
			st.swept(work, awake, sent > 0, len(wake) > 0, busy(sent), settled)
		}
		s.lastSweep.Store(time.Now().UnixNano())
		s.busySince.Store(0)
		if s.cfg.Observer != nil && !res.Blocked {
			s.cfg.Observer.SweepDone(time.Since(start))
		}
		if ctx.Err() != nil {
			s.logger.Info("sweeper stopped", "dispatched_in_last_sweep", res.Dispatched)
			return nil
		}
		if err != nil {
			failing++
			s.sweepFailed(failing, start, err)
			delay := retry.NextBackOff()
			if !s.dropped(ctx, err) {
				s.logger.Error("sweep failed; retrying", "err", err, "retry_in", delay.Round(time.Millisecond), "failures_in_a_row", failing)
			}
			next = time.Now().Add(delay)
			continue
		}
		s.tableGone.Store(false)
		if failing > 0 {
			s.logger.Info("sweep succeeded again", "failures_before", failing)
			failing = 0
			s.sweepFailed(0, start, nil)
			retry.Reset()
		}
		// The cursor's stats walk every floor: only for a line that is logged.
		if (res.Dispatched > 0 || res.FailedBatches > 0) && s.logger.Enabled(ctx, slog.LevelDebug) {
			cs := s.cursor.stats()
			s.logger.Debug("swept", "dispatched", res.Dispatched, "batches", res.Batches,
				"failed_batches", res.FailedBatches, "pages", res.Pages, "duration", time.Since(start), "tick", tick,
				"floors", cs.Members, "lowest_floor", cs.Lowest, "discovery_floor", cs.Discovery, "pending", cs.Pending, "xmin", cs.Xmin)
		}
		next = due
		if !res.due.IsZero() {
			next = res.due
		}
	}
}

// Behind is how far the sweeps are behind the commits at now: the age of
// the oldest row of the last page claimed, while a sweep runs and after one
// that left rows to send (a drain that goes on at its next sweep, a failed
// sweep); 0 once a sweep ends with none left. Pages are claimed oldest rows
// first, so while rows wait for a drain it is about the oldest's age,
// learned without a statement: a relay of many reads it of every outbox at
// each scrape. Failures keep it, and it grows while their rows wait: a sweep
// whose batches failed, the sweeps after it while the topics that failed
// back off, and those the broker breaker's being open keeps from reading.
// The rows of a tripped topic do not count: a tripped topic sends nothing
// until it is reset (a relay of many reads its outbox's oldest row from the
// database at the scrape instead, metrics.RegisterOutboxes).
func (s *Sweeper) Behind(now time.Time) time.Duration {
	at := s.behind.Load()
	if at == 0 {
		return 0
	}
	return max(0, now.Sub(time.Unix(0, at)))
}

// swept resets Behind after a sweep that left no row to send: not after
// one that failed, that ran out of time with rows left, whose batches
// failed, that left topics out to back off after failures, or while the
// broker breaker is not closed (their rows wait for later sweeps: a row
// failing at every sweep is lag as much as a backlog is, and a broker down
// for an hour is an hour of it). The breaker's state is read at the end:
// in a relay of many it is shared, and a sweep can end without a failure
// of its own while it is open or half-open (its sends refused while
// another outbox's trial is out, or the breaker opened by another
// outbox's failures mid-page).
func (s *Sweeper) swept(res SweepResult, err error) {
	if err == nil && !res.more && res.FailedBatches == 0 && !res.retrying && !res.Blocked &&
		s.gate.brokerState() == breaker.DependencyClosed {
		s.behind.Store(0)
	}
}

// claimed notes the oldest row of a page claimed (Behind).
func (s *Sweeper) claimed(msgs []producer.Message) {
	var oldest time.Time
	for _, m := range msgs {
		if oldest.IsZero() || m.CreatedAt.Before(oldest) {
			oldest = m.CreatedAt
		}
	}
	if !oldest.IsZero() {
		s.behind.Store(oldest.UnixNano())
	}
}

// Parked reports whether Run waits for a wake-up alone: its last sweep found
// the outbox holding nothing, it has a Host, and no reread of the cursor is
// due (that poll is one more sweep to come). The host's reconciliation looks
// at parked outboxes only; the others sweep on their own.
func (s *Sweeper) Parked() bool {
	if !s.parked.Load() {
		return false
	}
	_, poll := s.cursor.rereadAt()
	return !poll
}

// Asleep reports whether the sweeper is parked (Parked) and no sweep it was
// woken for is under way: what an operator reads as parked. A woken sweep
// keeps Parked set until it ends, its sweep before having found nothing, and
// the admin API counts no parked outbox's backlog: read with Parked, a
// tenant whose first rows in a while were being sent listed a backlog of 0.
func (s *Sweeper) Asleep() bool {
	// woken first: Run clears parked before woken, so a sweep that found
	// rows never reads as asleep in between.
	return !s.woken.Load() && s.Parked()
}

// Recheck makes the next sweep read every topic from its first outstanding
// row, rather than from the floors the sweeps have kept: a host calls it
// before it wakes a parked sweeper whose outbox it found holding rows, which
// may lie below the floors (put back by hand, or committed while no
// notification could come).
func (s *Sweeper) Recheck() {
	s.cursor.markStale()
	s.historyFound.Store(false)
}

// SweepFailure describes Run's sweeps failing one after another.
type SweepFailure struct {
	// Consecutive is how many sweeps failed in a row; Since, when the first
	// of them began; Err, the last one's error, cut short.
	Consecutive int
	Since       time.Time
	Err         string
}

// dropped reports whether err, a sweep's or its expiry pass's, says the
// outbox table is gone from under a host that lists its outboxes (a
// tenant's schema dropped), and then tells the host (ListingHost) and logs
// it at INFO: the failure is the host's news, not an operator's error. A
// sweep that fails so is tried again as any other, until the host stops it.
// Once per drop: the statements that fail after it (the expiry pass's, then
// the sweep's) are the same news, and ask the catalog no more.
func (s *Sweeper) dropped(ctx context.Context, err error) bool {
	lh, ok := s.cfg.Host.(ListingHost)
	if !ok {
		return false
	}
	if s.tableGone.Load() && serverRefused(err) {
		return true
	}
	if !s.store.gone(ctx, err) {
		return false
	}
	s.tableGone.Store(true)
	s.logger.Info("outbox table not found (its schema or table was dropped); its host lists the outboxes again", "err", err)
	lh.Gone()
	return true
}

// maxSweepErrorText bounds the error Failing reports: the status page shows
// it, and a statement's error may quote a long value.
const maxSweepErrorText = 500

// sweepFailed records that the n-th sweep in a row, begun at start, failed
// with err; n = 0: a sweep succeeded.
func (s *Sweeper) sweepFailed(n int, start time.Time, err error) {
	if o, ok := s.cfg.Observer.(SweepFailuresObserver); ok {
		o.SweepsFailing(n)
	}
	if n == 0 {
		s.failing.Store(nil)
		return
	}
	f := SweepFailure{Consecutive: n, Since: start, Err: truncate(err.Error(), maxSweepErrorText)}
	if prev := s.failing.Load(); prev != nil {
		f.Since = prev.Since
	}
	s.failing.Store(&f)
}

// Failing reports whether Run's last sweep failed, and how many before it
// failed in a row. A sweep fails on a database error (the database is down,
// or a statement fails); a broker's failures are the rows' and the topics',
// never the sweep's. Sweeps that fail while the database answers are a fault
// no backoff cures: the admin API's GET /status says degraded, and
// outbox_sweeps_failed_consecutive rises. Safe to call from any goroutine.
func (s *Sweeper) Failing() (SweepFailure, bool) {
	f := s.failing.Load()
	if f == nil {
		return SweepFailure{}, false
	}
	return *f, true
}

// Stall describes a sweep of Run that has made no progress for longer than
// the sweeper allows.
type Stall struct {
	// Since is when the sweep began; Progress, when a statement or a send of
	// it last returned (Since if none has); LastSweep, when the sweep before
	// it ended (zero if none did).
	Since, Progress, LastSweep time.Time
	// Ticks is how many of the schedule's ticks have passed since Progress,
	// of the MaxTicks allowed; Limit, the time without progress that is
	// allowed whatever the ticks.
	Ticks, MaxTicks int
	Limit           time.Duration
}

// Stalled reports whether Run's sweep in progress is wedged: no statement and
// no send of it has returned for longer than ticks ticks of the schedule, and
// than StallFloor of the send timeout. A live sweep moves on at least once per
// send (bounded by the send timeout) or statement (bounded by its own
// timeout), however long a drain or a split takes; what stops it for longer is
// a producer's call that ignores its context, or a page's move waiting on a
// lock nobody releases (the listing and a page's first claim give up on a
// lock after readLockTimeout), and restarting the process frees it. Between sweeps Run waits for a time it knows (the next tick, or the
// backoff after a failed sweep), so a sweeper that fails fast against a dead
// database is not stalled: readiness reports that. Safe to call from any
// goroutine.
func (s *Sweeper) Stalled(now time.Time, ticks int) (Stall, bool) {
	busy := s.busySince.Load()
	if busy == 0 {
		return Stall{}, false
	}
	st := Stall{Since: time.Unix(0, busy), Progress: time.Unix(0, max(busy, s.progress.last())),
		MaxTicks: ticks, Limit: StallFloor(s.cfg.SendTimeout)}
	if last := s.lastSweep.Load(); last != 0 {
		st.LastSweep = time.Unix(0, last)
	}
	if now.Sub(st.Progress) <= st.Limit {
		return st, false
	}
	for t := st.Progress; st.Ticks <= ticks; st.Ticks++ {
		t = s.cfg.Schedule.Next(t)
		if t.IsZero() || t.After(now) {
			return st, false
		}
	}
	return st, true
}

// StallFloor is the least time without progress that Stalled calls wedged,
// whatever the ticks: twice IdleInTransactionTimeout (the send timeout plus
// 5s), so that a send that takes its whole timeout, or a page's transaction
// that Postgres may end for idling, is never mistaken for a wedge.
func StallFloor(sendTimeout time.Duration) time.Duration {
	return 2 * IdleInTransactionTimeout(sendTimeout)
}

// sweepAt returns when the loop sweeps next unless woken: at the tick next,
// or at the earliest of polls (an awake sweeper's, the cursor's reread) if
// sooner. A parked sweeper waits for no tick, only for its polls (zero: for
// a wake-up alone), and a poll of its that falls after the tick counts as
// much as one before: an awake sweeper's polls once counted only before next,
// and one that parked within a poll of its tick, its lock still held, waited
// for a wake-up that its outbox's commits, silent while it held the lock,
// never sent (the host's reconciliation came first, up to 30 s later).
func sweepAt(next time.Time, parked bool, polls ...time.Time) time.Time {
	at := next
	if parked {
		at = time.Time{}
	}
	for _, p := range polls {
		if at.IsZero() || p.Before(at) {
			at = p
		}
	}
	return at
}

// waitFor waits until t (tick) or a wake-up, whichever comes first, and reports
// which, and whether ctx is still live. A nil wake waits for t alone; a zero t,
// for a wake-up alone.
func waitFor(ctx context.Context, t time.Time, wake <-chan struct{}) (tick, ok bool) {
	if t.IsZero() {
		select {
		case <-ctx.Done():
			return false, false
		case <-wake:
			return false, true
		}
	}
	d := time.Until(t)
	if d <= 0 {
		return true, ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false, false
	case <-timer.C:
		return true, true
	case <-wake:
		return false, true
	}
}

// sleepUntil waits until t and reports whether ctx is still live.
func sleepUntil(ctx context.Context, t time.Time) bool {
	_, ok := waitFor(ctx, t, nil)
	return ok
}

// TopicBreaker returns the per-topic breaker, for operators to list, trip and
// reset topics.
func (s *Sweeper) TopicBreaker() breaker.Breaker { return s.breaker }

// Sweep runs one tick now: the topic breaker's OnTick, then a sweep that reads
// and sends pages while they come back full, or until ctx is done. Tests and
// tools drive the sweeper with it; Run calls it on the schedule. The error is a
// database error; broker failures are recorded on the rows, counted in the
// result, and reported to the topic breaker.
func (s *Sweeper) Sweep(ctx context.Context) (SweepResult, error) {
	res, err := s.sweep(ctx, ctx, time.Time{}, true, nil)
	s.swept(res, err)
	return res, err
}
