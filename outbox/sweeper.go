package outbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
)

// Defaults for [Config].
const (
	ConcurrencyDefault      = 4
	DeadLetterLimitDefault  = 100
	DeadLetterWindowDefault = 5 * time.Minute
	MaxAttemptsDefault      = 10
	PageSizeDefault         = 500
	SendTimeoutDefault      = 15 * time.Second
	ShutdownTimeoutDefault  = 10 * time.Second
	TickDefault             = time.Second
)

// Bounds that Config.Validate enforces. They catch typos (a page of 5,000,000
// rows would hold gigabytes in memory), not taste.
const (
	ConcurrencyMax = 256
	PageSizeMax    = 100_000
)

// Ordering is what order several sweepers on one table keep.
type Ordering string

const (
	// OrderingTopic keeps each topic's rows in id order across sweepers: at
	// most one sweeper sends a topic's batch at a time (a transaction-scoped
	// advisory lock per topic, taken by the batch's claim), and a batch is sent
	// whole or not at all, so no batch overtakes an earlier one. Sweepers
	// spread over the topics; one topic is sent by one sweeper at a time.
	OrderingTopic Ordering = "topic"
	// OrderingNone lets sweepers share a topic: a batch sends the rows it could
	// claim and skips those another sweeper holds, so a single busy topic
	// drains with every sweeper, and its messages may arrive out of id order.
	// One sweeper on its own still sends each topic in order.
	OrderingNone Ordering = "none"
)

// Schedule says when the next tick starts. robfig/cron's Schedule satisfies it.
type Schedule interface {
	// Next returns the first tick time after t.
	Next(t time.Time) time.Time
}

// Every returns a schedule that ticks every d.
func Every(d time.Duration) Schedule { return every(d) }

type every time.Duration

func (e every) Next(t time.Time) time.Time { return t.Add(time.Duration(e)) }

// Config configures a [Sweeper]. The zero value of each field means its default.
type Config struct {
	// Concurrency is how many topics are sent at once. The batches of one topic
	// are always sent one after another, in id order. Defaults to
	// ConcurrencyDefault.
	Concurrency int

	// DisableNotify turns off wake-ups on commit. By default the sweeper holds
	// one connection of its own that LISTENs for the outbox's trigger
	// (migration 4), and sweeps as soon as rows are committed; scheduled ticks
	// run all the same, and carry the sweeper while that connection is down.
	// The connection is opened with the pool's connection config.
	DisableNotify bool

	// Ordering says what order holds among sweepers on one table. Defaults to
	// OrderingTopic.
	Ordering Ordering

	// Alerter receives an alert when the dead-letter storm guard stops a topic.
	// Optional.
	Alerter alert.Alerter

	// DeadLetterLimit and DeadLetterWindow are the storm guard: when more than
	// DeadLetterLimit rows of one topic would be dead-lettered within
	// DeadLetterWindow, something is wrong beyond single messages (a broker
	// error misclassified as the messages' fault would otherwise empty the
	// outbox into the dead-letter table). The sweeper then stops dead-lettering
	// the topic, trips it, and alerts. Default to DeadLetterLimitDefault and
	// DeadLetterWindowDefault; a negative limit disables the guard.
	DeadLetterLimit  int
	DeadLetterWindow time.Duration

	// Logger receives the sweeper's logs. Defaults to discarding them.
	Logger *slog.Logger

	// Observer is told what each sweep does, for metrics. Optional.
	Observer Observer

	// MaxAttempts is how many transient failures a row may have: the row that
	// reaches it is dead-lettered with reason max_retries_exceeded. Defaults to
	// MaxAttemptsDefault; a negative value keeps rows forever.
	MaxAttempts int

	// PageSize is the most rows read per page. Memory use is bounded by it, not by
	// the backlog. Defaults to PageSizeDefault.
	PageSize int

	// Schedule says when ticks start. Defaults to Every(Tick).
	Schedule Schedule

	// SendTimeout bounds one batch's send, from the producer's call to its
	// answer. A send that runs out fails as transient, and its rows count an
	// attempt. The batch's transaction stays open meanwhile; it sets its own
	// idle_in_transaction_session_timeout to IdleInTransactionTimeout of this,
	// which overrides the server's for that transaction. Defaults to
	// SendTimeoutDefault.
	SendTimeout time.Duration

	// ShutdownTimeout is how long batches already in flight may take to finish
	// once Run's context is done; after it their sends are cancelled and their
	// rows stay outstanding. Defaults to ShutdownTimeoutDefault.
	ShutdownTimeout time.Duration

	// Table names the outbox. Zero fields take Table's defaults.
	Table Table

	// Tick is the interval between ticks when Schedule is nil. Defaults to
	// TickDefault.
	Tick time.Duration

	// TopicBreaker is the per-topic circuit breaker: topics it has tripped are
	// left out of paging. Defaults to an in-memory breaker with
	// breaker.Settings' defaults that logs its state changes to Logger.
	TopicBreaker breaker.Breaker
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Concurrency == 0 {
		c.Concurrency = ConcurrencyDefault
	}
	if c.DeadLetterLimit == 0 {
		c.DeadLetterLimit = DeadLetterLimitDefault
	}
	if c.DeadLetterWindow == 0 {
		c.DeadLetterWindow = DeadLetterWindowDefault
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = MaxAttemptsDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.PageSize == 0 {
		c.PageSize = PageSizeDefault
	}
	if c.SendTimeout == 0 {
		c.SendTimeout = SendTimeoutDefault
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = ShutdownTimeoutDefault
	}
	if c.Tick == 0 {
		c.Tick = TickDefault
	}
	if c.Schedule == nil {
		c.Schedule = Every(c.Tick)
	}
	if c.TopicBreaker == nil {
		c.TopicBreaker = breaker.New(breaker.Settings{OnStateChange: LogTopicStateChange(c.Logger)})
	}
	if c.Ordering == "" {
		c.Ordering = OrderingTopic
	}
	c.Table = c.Table.WithDefaults()
	return c
}

// LogTopicStateChange returns a breaker.Settings.OnStateChange hook that logs
// every change of a topic's state: a trip as a warning, the rest as info.
func LogTopicStateChange(logger *slog.Logger) func(topic string, from, to breaker.State, reason string) {
	return func(topic string, from, to breaker.State, reason string) {
		level := slog.LevelInfo
		if to == breaker.StateTripped {
			level = slog.LevelWarn
		}
		logger.Log(context.Background(), level, "topic breaker: "+to.String(),
			"topic", topic, "from", from.String(), "to", to.String(), "reason", reason)
	}
}

// Observer is told what the sweeper does; the metrics package implements it.
// Its methods are called from the sweep's goroutines and must be quick.
type Observer interface {
	// BatchDispatched reports a batch the broker accepted, with each message's
	// time from the application's write to the broker's acceptance.
	BatchDispatched(topic string, size int, latencies []time.Duration)
	// BatchFailed reports a failed batch and its failure class.
	BatchFailed(topic string, class producer.Class)
	// DeadLettered reports rows moved to the dead-letter table.
	DeadLettered(topic string, n int)
	// SweepDone reports a tick's sweep and how long it took.
	SweepDone(d time.Duration)
}

// ListenObserver is an Observer that also wants to know whether the sweeper's
// listen connection (wake-up on commit) is up. The metrics package implements it.
type ListenObserver interface {
	Observer
	// Listening reports the connection up (true) or down (false).
	Listening(up bool)
}

// Validate reports the first field out of range as a [*ConfigError]. Call it on
// a config with defaults filled in (NewSweeper does): it rejects zeros, so that a
// command line that sets a value to 0 is told so rather than given the default.
func (c Config) Validate() error {
	if c.Concurrency < 1 || c.Concurrency > ConcurrencyMax {
		return &ConfigError{"concurrency", "concurrency", fmt.Sprint(c.Concurrency), fmt.Sprintf("it must be between 1 and %d", ConcurrencyMax)}
	}
	if c.PageSize < 1 || c.PageSize > PageSizeMax {
		return &ConfigError{"page size", "page-size", fmt.Sprint(c.PageSize), fmt.Sprintf("it must be between 1 and %d", PageSizeMax)}
	}
	if c.MaxAttempts == 0 || c.MaxAttempts < -1 {
		return &ConfigError{"max attempts", "max-attempts", fmt.Sprint(c.MaxAttempts), "it must be at least 1, or -1 to never dead-letter for attempts"}
	}
	if c.DeadLetterLimit == 0 || c.DeadLetterLimit < -1 {
		return &ConfigError{"dead-letter limit", "dead-letter-limit", fmt.Sprint(c.DeadLetterLimit), "it must be at least 1, or -1 to turn the storm guard off"}
	}
	if c.DeadLetterWindow < time.Second {
		return &ConfigError{"dead-letter window", "dead-letter-window", c.DeadLetterWindow.String(), "it must be at least 1s"}
	}
	if c.SendTimeout < time.Millisecond {
		return &ConfigError{"send timeout", "send-timeout", c.SendTimeout.String(), "it must be at least 1ms"}
	}
	if c.ShutdownTimeout < time.Millisecond {
		return &ConfigError{"shutdown timeout", "shutdown-timeout", c.ShutdownTimeout.String(), "it must be at least 1ms (the time batches in flight get to finish)"}
	}
	if c.Ordering != OrderingTopic && c.Ordering != OrderingNone {
		return &ConfigError{"ordering", "ordering", fmt.Sprintf("%q", c.Ordering), `it must be "topic" (per-topic id order across sweepers) or "none"`}
	}
	if c.Tick < time.Millisecond {
		return &ConfigError{"tick", "tick", c.Tick.String(), "it must be at least 1ms"}
	}
	return c.Table.Validate()
}

// SweepResult counts what one sweep did.
type SweepResult struct {
	// Pages is how many pages were read.
	Pages int
	// Dispatched is how many rows the broker accepted and were marked dispatched.
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
	// DeadLettered counts the rows moved to the dead-letter table.
	DeadLettered int
}

// Sweeper relays outstanding outbox rows to a producer.
//
// A sweep reads a page of outstanding rows in id order, groups it by topic
// keeping that order, lets the producer cut each group into batches, and sends up
// to Concurrency topics at once, the batches of one topic in order. Each batch is
// claimed, sent and marked dispatched in its own transaction (see store.dispatch),
// so a later failure never undoes an earlier success and a second sweeper on the
// same table never sends a row this one has in flight. A failed batch raises its
// rows' attempts, records the error, and stops its topic until the next sweep;
// other topics go on. A message-class failure stops nothing: the rows it names
// count an attempt and the rest of the batch is sent at once, so one poison
// message cannot hold its topic. While pages come back full, the sweep reads the
// next page at once, so a backlog drains at the database's pace, not the tick's.
type Sweeper struct {
	breaker  breaker.Breaker
	cfg      Config
	logger   *slog.Logger
	producer producer.Producer
	store    *store
	// probes counts the trials of a half-open broker breaker, to take each
	// from the next topic: one topic whose batch fails by itself must not be
	// the only trial there ever is.
	probes atomic.Uint64
}

// NewSweeper returns a sweeper over pool's outbox table cfg.Table, sending to p.
// It reports an invalid configuration. The pool should allow Concurrency+1
// connections: one per topic in flight and one to read pages.
func NewSweeper(pool *pgxpool.Pool, p producer.Producer, cfg Config) (*Sweeper, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Sweeper{
		breaker:  cfg.TopicBreaker,
		cfg:      cfg,
		logger:   cfg.Logger,
		producer: p,
		store: newStore(pool, cfg.Table, deadLetterPolicy{
			maxAttempts: max(cfg.MaxAttempts, 0),
			stormLimit:  max(cfg.DeadLetterLimit, 0),
			stormWindow: cfg.DeadLetterWindow,
		}, cfg.Ordering, cfg.SendTimeout),
	}, nil
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

	var wake <-chan struct{}
	if !s.cfg.DisableNotify {
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
	}

	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = 500 * time.Millisecond
	retry.MaxInterval = 30 * time.Second
	failing := 0

	s.logger.Info("sweeper started", "table", s.cfg.Table.String(), "page_size", s.cfg.PageSize,
		"concurrency", s.cfg.Concurrency, "ordering", string(s.cfg.Ordering), "notify", !s.cfg.DisableNotify)
	next := time.Now()
	for {
		// While sweeps fail, only the backoff decides when to try again.
		woken := wake
		if failing > 0 {
			woken = nil
		}
		tick, ok := waitFor(ctx, next, woken)
		if !ok {
			s.logger.Info("sweeper stopped")
			return nil
		}
		start := time.Now()
		// A wake-up sweeps in between ticks: it leaves the cooldowns alone and
		// pages until the next tick is due, as a tick does.
		due := next
		if tick {
			due = s.cfg.Schedule.Next(start)
		}
		res, err := s.sweep(ctx, work, due, tick)
		if s.cfg.Observer != nil && !res.Blocked {
			s.cfg.Observer.SweepDone(time.Since(start))
		}
		if ctx.Err() != nil {
			s.logger.Info("sweeper stopped", "dispatched_in_last_sweep", res.Dispatched)
			return nil
		}
		if err != nil {
			failing++
			delay := retry.NextBackOff()
			s.logger.Error("sweep failed; retrying", "err", err, "retry_in", delay.Round(time.Millisecond), "failures_in_a_row", failing)
			next = time.Now().Add(delay)
			continue
		}
		if failing > 0 {
			s.logger.Info("sweep succeeded again", "failures_before", failing)
			failing = 0
			retry.Reset()
		}
		if res.Dispatched > 0 || res.FailedBatches > 0 {
			s.logger.Debug("swept", "dispatched", res.Dispatched, "batches", res.Batches,
				"failed_batches", res.FailedBatches, "pages", res.Pages, "duration", time.Since(start), "tick", tick)
		}
		next = due
	}
}

// waitFor waits until t (tick) or a wake-up, whichever comes first, and reports
// which, and whether ctx is still live. A nil wake waits for t alone.
func waitFor(ctx context.Context, t time.Time, wake <-chan struct{}) (tick, ok bool) {
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
	return s.sweep(ctx, ctx, time.Time{}, true)
}

// sweep runs one sweep, a tick's (which first advances the topic breaker's
// cooldowns) or a wake-up's: lists the topics with outstanding rows that the topic
// breaker allows, then reads and sends pages while stop is live, topics may hold
// more, and the next tick (due; zero for none) has not come. Sends use work,
// which outlives stop during a graceful shutdown.
//
// A page gives each live topic an equal share, read in id order from where the
// topic's previous page ended, so a deep backlog in one topic cannot fill the
// pages, and every page moves on. Rows left behind (poison, held by another
// sweeper) wait for the next sweep, which starts each topic from its lowest id.
// Topics that appear during a tick are read from the next one.
func (s *Sweeper) sweep(stop, work context.Context, due time.Time, tick bool) (SweepResult, error) {
	if tick {
		s.breaker.OnTick()
	}
	var res SweepResult
	// An open dependency breaker (breaker.Guarded) fails the tick fast: no page,
	// no call to the broker, and the rows keep their attempts.
	if b, ok := s.producer.(interface{ Blocked() bool }); ok && b.Blocked() {
		res.Blocked = true
		return res, nil
	}
	prober, _ := s.producer.(interface{ Probing() bool })
	plan := s.breaker.Plan()
	live, err := s.store.topics(work, plan.Excluded)
	if err != nil {
		return res, fmt.Errorf("list topics with outstanding rows in %s: %w", s.cfg.Table, err)
	}
	after := make([]int64, len(live))
	// A half-open one lets a single trial through and refuses the others: send
	// one batch alone first, rather than claim batches only to have them
	// refused, and sweep on only if it closed the breaker. Each trial takes
	// the next topic in turn. The tried topic sits out the rest of the sweep:
	// it had its batch, and its outcome is in.
	if prober != nil && prober.Probing() && len(live) > 0 {
		i := int(s.probes.Add(1)-1) % len(live)
		msgs, err := s.store.page(work, live[i:i+1], after[i:i+1], s.cfg.PageSize)
		if err != nil {
			return res, fmt.Errorf("read a page of outstanding rows from %s: %w", s.cfg.Table, err)
		}
		res.Pages++
		if _, err := s.sendPage(stop, work, groupByTopic(msgs), plan, true, &res); err != nil || prober.Probing() {
			return res, err
		}
		if b, ok := s.producer.(interface{ Blocked() bool }); ok && b.Blocked() {
			return res, nil
		}
		live = slices.Delete(live, i, i+1)
		after = after[:len(live)] // all zero: no topic has paged yet
	}
	for stop.Err() == nil && len(live) > 0 {
		// A page reads at most PageSize topics (a share of one each when there
		// are more), so the page size bounds memory however many topics there
		// are; topics beyond it wait their turn at the back of the queue.
		window := min(len(live), s.cfg.PageSize)
		share := (s.cfg.PageSize + window - 1) / window
		msgs, err := s.store.page(work, live[:window], after[:window], share)
		if err != nil {
			return res, fmt.Errorf("read a page of outstanding rows from %s: %w", s.cfg.Table, err)
		}
		res.Pages++
		groups := groupByTopic(msgs)
		stopped, err := s.sendPage(stop, work, groups, plan, false, &res)
		if err != nil {
			return res, err
		}
		// Topics that stopped, or returned less than a share (nothing more
		// behind it), are done for this sweep; the others page on, after the
		// topics that waited.
		done := make(map[string]bool, window)
		for _, t := range stopped {
			done[t] = true
		}
		last := make(map[string]int64, len(groups))
		for _, g := range groups {
			last[g.topic] = g.msgs[len(g.msgs)-1].ID
			if len(g.msgs) < share {
				done[g.topic] = true
			}
		}
		next := make([]string, 0, len(live))
		nextAfter := make([]int64, 0, len(live))
		next, nextAfter = append(next, live[window:]...), append(nextAfter, after[window:]...)
		for i, t := range live[:window] {
			id, paged := last[t]
			if !paged || done[t] {
				continue // drained (nothing in this page), stopped, or short
			}
			next, nextAfter = append(next, t), append(nextAfter, max(id, after[i]))
		}
		live, after = next, nextAfter
		if !due.IsZero() && !time.Now().Before(due) {
			break
		}
	}
	return res, nil
}

// sendPage sends a page's topics concurrently, adding to res. It returns the
// topics that stopped for the rest of the sweep.
func (s *Sweeper) sendPage(stop, work context.Context, groups []topicGroup, plan breaker.Plan, probe bool, res *SweepResult) ([]string, error) {
	var (
		mu         sync.Mutex
		dbErr      error
		stopped    []string
		dispatched int
		transient  = map[string]error{}
		wg         sync.WaitGroup
		sem        = make(chan struct{}, s.cfg.Concurrency)
	)
	for _, g := range groups {
		if stop.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			tr, err := s.sendTopic(stop, work, g, plan, probe)
			mu.Lock()
			defer mu.Unlock()
			dispatched += tr.dispatched
			if tr.transient != nil {
				transient[g.topic] = tr.transient
			}
			res.Dispatched += tr.dispatched
			res.Batches += tr.batches
			res.FailedBatches += tr.failedBatches
			res.Skipped += tr.skipped
			res.DeadLettered += tr.deadLettered
			if tr.failed {
				res.FailedTopics = append(res.FailedTopics, g.topic)
			}
			if tr.failed || tr.contended || plan.Trials[g.topic] {
				stopped = append(stopped, g.topic)
			}
			if err != nil && dbErr == nil {
				dbErr = err
			}
		})
	}
	wg.Wait()
	// A transient failure says something of its topic only if the broker took
	// other batches meanwhile; when every send of the page failed, the broker
	// (the dependency breaker's business) is the likelier cause, and tripping
	// every topic would keep them all out long after it is back.
	if dispatched > 0 {
		for topic, err := range transient {
			s.breaker.Failure(topic, plan.Gen(topic), false, truncate(err.Error(), maxErrorText))
		}
	} else if len(transient) > 0 {
		s.logger.Debug("every send of the page failed: not counted against the topics", "topics", len(transient))
	}
	return stopped, dbErr
}

type topicResult struct {
	batches, deadLettered, failedBatches, dispatched, skipped int
	// transient is the topic's transient failure, reported to the topic breaker
	// once the page shows whether the broker took anything (see sendPage).
	transient error
	// failed and contended say why the topic stopped, if it did.
	failed, contended bool
}

// sendTopic sends one topic's messages of a page, batch after batch, and stops at
// the first failed or contended batch so that a later batch never overtakes an
// earlier one. A half-open topic sends one batch: its trial; so does any topic
// while the broker breaker probes (probe). Outcomes go to the topic breaker.
func (s *Sweeper) sendTopic(stop, work context.Context, g topicGroup, plan breaker.Plan, probe bool) (topicResult, error) {
	var tr topicResult
	topic, msgs, gen := g.topic, g.msgs, plan.Gen(g.topic)
	batches, err := s.producer.Batches(work, topic, msgs)
	if err != nil {
		if stopTopic, dbErr := s.reject(work, g, gen, err, &tr); stopTopic || dbErr != nil {
			return tr, dbErr
		}
	}

	send := s.producer.Send
	if probe {
		send = trialSend(s.producer.Send)
	}
	for _, b := range batches {
		if stop.Err() != nil {
			break
		}
		if err := s.sendBatch(work, b, gen, send, &tr); err != nil || tr.failed || tr.contended {
			return tr, err
		}
		// A half-open topic sends one batch, its trial: the first whose outcome
		// says something of the topic (a batch of poison rows only does not).
		// A half-open broker breaker (probe) gets one batch, whatever it says.
		if (plan.Trials[topic] && tr.dispatched > 0) || probe {
			break
		}
	}
	return tr, nil
}

// reject records the failure of the rows of g that the producer could not cut
// into batches (err from Batches) as a failed send: message-class rows are
// dead-lettered, and when the producer named no row, all of g fails and the
// topic stops. It reports whether the topic stops for this sweep.
func (s *Sweeper) reject(work context.Context, g topicGroup, gen uint64, err error, tr *topicResult) (stopTopic bool, dbErr error) {
	page := producer.Batch{Topic: g.topic, Messages: g.msgs}
	rejected := subset(page, slices.Sorted(slices.Values(producer.MessageIDs(err))))
	whole := len(rejected.Messages) == 0
	if class := producer.ClassOf(err); whole && (class == producer.ClassTransient || class == producer.ClassLocal) {
		// The producer could not cut anything (its broker unreachable, say):
		// nothing was sent and nothing is wrong with the rows, so they keep
		// their attempts; counted, a broker down for --max-attempts sweeps
		// would dead-letter the outbox. The topic stops for this sweep.
		tr.failed = true
		tr.failedBatches++
		s.observeFailure(g.topic, batchOutcome{sendErr: err})
		s.logFailure(page, err)
		s.reportFailure(g.topic, gen, err, tr)
		return true, nil
	}
	if whole {
		// Nothing of the topic can be cut: count it as a failed send of all
		// its rows in the page, so they carry the error.
		rejected = page
	}
	out, dbErr := s.store.dispatch(work, rejected, s.cfg.SendTimeout, func(context.Context, producer.Batch) error { return err })
	if dbErr != nil {
		return true, dbErr
	}
	if out.contended {
		if s.cfg.Ordering == OrderingTopic {
			tr.contended = true
			tr.skipped += len(g.msgs)
			return true, nil
		}
		tr.skipped += len(rejected.Messages) - out.claimed
		if out.claimed == 0 {
			// Another sweeper has them; if that was all the topic had, the
			// topic is done for this sweep.
			tr.contended = whole
			return whole, nil
		}
	}
	rejected = out.sent
	tr.failedBatches++
	tr.deadLettered += out.deadLettered
	s.observeFailure(g.topic, out)
	s.logFailure(rejected, err)
	if out.deadLettered > 0 {
		s.logDeadLettered(g.topic, out)
	}
	if out.storm {
		s.stopStorm(g.topic, len(out.failed), err)
		tr.failed = true
		return true, nil
	}
	if whole {
		s.reportFailure(g.topic, gen, err, tr)
		tr.failed = true
		return true, nil
	}
	return false, nil // some messages can never be sent; the others go on
}

// trialSend wraps the send of the batch that tries a half-open broker breaker:
// a transient failure there is the broker still being down, which the breaker
// has just counted, not the rows' fault, so it becomes local: the rows go back
// without an attempt. Counted, every trial of a long outage would add one, and
// the trial rows would be dead-lettered as max_retries_exceeded.
func trialSend(send func(context.Context, producer.Batch) error) func(context.Context, producer.Batch) error {
	return func(ctx context.Context, b producer.Batch) error {
		err := send(ctx, b)
		if err != nil && producer.ClassOf(err) == producer.ClassTransient {
			return producer.NewLocalError(fmt.Errorf("trial send of the half-open broker breaker failed, rows kept without an attempt: %w", err))
		}
		return err
	}
}

// reportFailure tells the topic breaker about a failed batch: a topic-class
// failure at once; a transient one is kept in tr for sendPage to weigh.
// Message-class failures are the messages' and local ones nobody's: neither
// counts.
func (s *Sweeper) reportFailure(topic string, gen uint64, err error, tr *topicResult) {
	switch producer.ClassOf(err) {
	case producer.ClassTopic:
		s.breaker.Failure(topic, gen, true, truncate(err.Error(), maxErrorText))
	case producer.ClassTransient:
		tr.transient = err
	}
}

// sendBatch sends b. After a message-class failure it sends the rest of b
// without the rows the failure named, at once: a poison message must not hold
// its neighbours. Any other failure, or contention, sets tr.failed or
// tr.contended and stops.
func (s *Sweeper) sendBatch(work context.Context, b producer.Batch, gen uint64, send func(context.Context, producer.Batch) error, tr *topicResult) error {
	for len(b.Messages) > 0 {
		out, err := s.store.dispatch(work, b, s.cfg.SendTimeout, send)
		if err != nil {
			return err
		}
		if out.contended {
			tr.skipped += len(b.Messages) - out.claimed
			if out.claimed == 0 {
				// Under OrderingNone another sweeper has the rows: go on with
				// the next batch. Under OrderingTopic the topic stops here, so
				// that no later batch overtakes this one.
				tr.contended = s.cfg.Ordering == OrderingTopic
				return nil
			}
		}
		b = out.sent
		tr.batches++
		if out.sendErr == nil {
			s.breaker.Success(b.Topic, gen)
			tr.dispatched += out.claimed
			if s.cfg.Observer != nil {
				now := time.Now()
				lat := make([]time.Duration, len(b.Messages))
				for i := range b.Messages {
					lat[i] = now.Sub(b.Messages[i].CreatedAt)
				}
				s.cfg.Observer.BatchDispatched(b.Topic, len(b.Messages), lat)
			}
			if s.logger.Enabled(work, slog.LevelDebug) {
				s.logger.Debug("batch dispatched", "topic", b.Topic, "num_rows", out.claimed,
					"first_id", b.Messages[0].ID, "last_id", b.Messages[len(b.Messages)-1].ID,
					"correlation_ids", correlationIDs(b, maxLoggedIDs))
			}
			return nil
		}
		tr.failedBatches++
		tr.deadLettered += out.deadLettered
		s.observeFailure(b.Topic, out)
		s.logFailure(b, out.sendErr)
		if out.deadLettered > 0 {
			s.logDeadLettered(b.Topic, out)
		}
		if out.storm {
			s.stopStorm(b.Topic, len(out.failed), out.sendErr)
			tr.failed = true
			return nil
		}
		// Failures that count an attempt, and local ones (nothing was sent),
		// stop the topic; a message-class one that dead-lettered its rows does
		// not: the rest of the batch goes on at once.
		if out.attempted || producer.ClassOf(out.sendErr) != producer.ClassMessage {
			s.reportFailure(b.Topic, gen, out.sendErr, tr)
			tr.failed = true
			return nil
		}
		b = without(b, out.failed)
	}
	return nil
}

// maxLoggedIDs bounds the correlation ids on one log line.
const maxLoggedIDs = 10

// observeFailure tells the observer about a failed batch and its dead letters.
func (s *Sweeper) observeFailure(topic string, out batchOutcome) {
	if s.cfg.Observer == nil {
		return
	}
	s.cfg.Observer.BatchFailed(topic, producer.ClassOf(out.sendErr))
	if out.deadLettered > 0 {
		s.cfg.Observer.DeadLettered(topic, out.deadLettered)
	}
}

// logDeadLettered logs rows moved to the dead-letter table: topic, reason and
// the rows' correlation ids as the move returned them, never a payload.
func (s *Sweeper) logDeadLettered(topic string, out batchOutcome) {
	s.logger.Warn("rows dead-lettered", "topic", topic, "num_rows", out.deadLettered, "reason", out.deadReason,
		"correlation_ids", out.deadCorrelationIDs, "table", s.cfg.Table.DeadLetterName())
}

// stopStorm trips a topic whose messages are being rejected faster than the
// storm guard allows, and alerts: a broker error misread as the messages' fault
// must not empty the outbox into the dead-letter table.
func (s *Sweeper) stopStorm(topic string, n int, err error) {
	summary := fmt.Sprintf("dead-letter storm on topic %q: %d more rows rejected (%s) with more than %d dead-lettered within %s; "+
		"dead-lettering stopped and the topic tripped. Check the producer's error, fix it, then reset the topic",
		topic, n, producer.ReasonOf(err), s.cfg.DeadLetterLimit, s.cfg.DeadLetterWindow)
	s.breaker.Trip(topic, summary)
	s.logger.Error(summary, "topic", topic, "err", err)
	if s.cfg.Alerter != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.cfg.Alerter.Alert(ctx, alert.Alert{Time: time.Now().UTC(), Severity: "critical", Component: "dead-letter-storm-guard", Summary: summary})
	}
}

// logFailure logs a failed batch. b is never empty: every caller sent or
// rejected at least one row.
func (s *Sweeper) logFailure(b producer.Batch, err error) {
	class := producer.ClassOf(err)
	level, msg := slog.LevelWarn, "batch failed; topic stops until the next sweep"
	switch class {
	case producer.ClassLocal:
		level, msg = slog.LevelInfo, "batch cancelled; its rows stay outstanding" // shutting down: nothing is wrong
	case producer.ClassMessage:
		msg = "messages rejected; the rest of the topic goes on"
	}
	s.logger.Log(context.Background(), level, msg,
		"topic", b.Topic, "class", class.String(), "reason", producer.ReasonOf(err), "num_rows", len(b.Messages),
		"first_id", b.Messages[0].ID, "last_id", b.Messages[len(b.Messages)-1].ID,
		"correlation_ids", correlationIDs(b, maxLoggedIDs), "err", err)
}

// correlationIDs returns up to n non-empty correlation ids of b.
func correlationIDs(b producer.Batch, n int) []string {
	var out []string
	for _, m := range b.Messages {
		if m.CorrelationID != "" {
			out = append(out, m.CorrelationID)
			if len(out) == n {
				break
			}
		}
	}
	return out
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
