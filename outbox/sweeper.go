package outbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-sweeper/sweeper/producer"
)

// Defaults for [Config].
const (
	ConcurrencyDefault     = 4
	PageSizeDefault        = 500
	ShutdownTimeoutDefault = 10 * time.Second
	TickDefault            = time.Second
)

// Bounds that Config.Validate enforces. They catch typos (a page of 5,000,000
// rows would hold gigabytes in memory), not taste.
const (
	ConcurrencyMax = 256
	PageSizeMax    = 100_000
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

	// Logger receives the sweeper's logs. Defaults to discarding them.
	Logger *slog.Logger

	// PageSize is the most rows read per page. Memory use is bounded by it, not by
	// the backlog. Defaults to PageSizeDefault.
	PageSize int

	// Schedule says when ticks start. Defaults to Every(Tick).
	Schedule Schedule

	// ShutdownTimeout is how long batches already in flight may take to finish
	// once Run's context is done; after it their sends are cancelled and their
	// rows stay outstanding. Defaults to ShutdownTimeoutDefault.
	ShutdownTimeout time.Duration

	// Table names the outbox. Zero fields take Table's defaults.
	Table Table

	// Tick is the interval between ticks when Schedule is nil. Defaults to
	// TickDefault.
	Tick time.Duration
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Concurrency == 0 {
		c.Concurrency = ConcurrencyDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.PageSize == 0 {
		c.PageSize = PageSizeDefault
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
	c.Table = c.Table.WithDefaults()
	return c
}

// Validate reports the first field out of range, naming its flag and value.
func (c Config) Validate() error {
	if c.Concurrency < 1 || c.Concurrency > ConcurrencyMax {
		return fmt.Errorf("concurrency (--concurrency) is %d: it must be between 1 and %d", c.Concurrency, ConcurrencyMax)
	}
	if c.PageSize < 1 || c.PageSize > PageSizeMax {
		return fmt.Errorf("page size (--page-size) is %d: it must be between 1 and %d", c.PageSize, PageSizeMax)
	}
	if c.ShutdownTimeout < 0 {
		return fmt.Errorf("shutdown timeout (--shutdown-timeout) is %s: it must not be negative", c.ShutdownTimeout)
	}
	if c.Tick < time.Millisecond {
		return fmt.Errorf("tick (--tick) is %s: it must be at least 1ms", c.Tick)
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
	// Skipped is how many paged rows were not claimed, because another sweeper had
	// them in flight or had dispatched them meanwhile.
	Skipped int
	// FailedTopics lists the topics that stopped for this sweep after a failure,
	// in the order they failed.
	FailedTopics []string
}

// Sweeper relays outstanding outbox rows to a producer.
//
// A sweep reads a page of outstanding rows in id order, groups it by topic
// keeping that order, lets the producer cut each group into batches, and sends up
// to Concurrency topics at once, the batches of one topic in order. Each batch is
// claimed, sent and marked dispatched in its own transaction (see store.dispatch),
// so a later failure never undoes an earlier success and a second sweeper on the
// same table never sends a row this one has in flight. A failed batch raises its
// rows' attempts, records the error, and stops its topic until the next tick;
// other topics go on. While pages come back full and rows move, the sweep reads
// the next page at once, so a backlog drains at the database's pace, not the
// tick's.
type Sweeper struct {
	cfg      Config
	logger   *slog.Logger
	producer producer.Producer
	store    *store
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
		cfg:      cfg,
		logger:   cfg.Logger,
		producer: p,
		store:    newStore(pool, cfg.Table),
	}, nil
}

// Run sweeps on the schedule until ctx is done, then stops reading pages, lets
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

	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = 500 * time.Millisecond
	retry.MaxInterval = 30 * time.Second
	failing := 0

	s.logger.Info("sweeper started", "table", s.cfg.Table.String(), "page_size", s.cfg.PageSize, "concurrency", s.cfg.Concurrency)
	next := time.Now()
	for {
		if !sleepUntil(ctx, next) {
			s.logger.Info("sweeper stopped")
			return nil
		}
		start := time.Now()
		due := s.cfg.Schedule.Next(start)
		res, err := s.sweep(ctx, work, due)
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
				"failed_batches", res.FailedBatches, "pages", res.Pages, "duration", time.Since(start))
		}
		next = due
	}
}

// sleepUntil waits until t and reports whether ctx is still live.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// Sweep runs one sweep now: it reads and sends pages until a page is not full,
// nothing moved, or ctx is done. Tests and tools drive the sweeper with it; Run
// calls it on the schedule. The error is a database error; broker failures are
// recorded on the rows and counted in the result.
func (s *Sweeper) Sweep(ctx context.Context) (SweepResult, error) {
	return s.sweep(ctx, ctx, time.Time{})
}

// sweep reads pages while stop is live, pages come back full, rows move, and the
// next tick (due; zero for none) has not come. Sends use work, which outlives
// stop during a graceful shutdown.
func (s *Sweeper) sweep(stop, work context.Context, due time.Time) (SweepResult, error) {
	var (
		res SweepResult
		// after is where the next page starts. Rows at or below it that are still
		// outstanding failed in this sweep (their topic is skipped) or are in
		// flight in another sweeper; either way they wait for the next sweep, which
		// starts again from the lowest id.
		after int64
	)
	for stop.Err() == nil {
		msgs, err := s.store.page(work, s.cfg.PageSize, res.FailedTopics, after)
		if err != nil {
			return res, fmt.Errorf("read a page of outstanding rows from %s: %w", s.cfg.Table, err)
		}
		res.Pages++
		if len(msgs) == 0 {
			break
		}
		before := res.Dispatched
		after = msgs[len(msgs)-1].ID
		if err := s.sendPage(stop, work, msgs, &res); err != nil {
			return res, err
		}
		if len(msgs) < s.cfg.PageSize || res.Dispatched == before || (!due.IsZero() && !time.Now().Before(due)) {
			break
		}
	}
	return res, nil
}

// sendPage groups msgs by topic and sends the topics concurrently, adding to res.
func (s *Sweeper) sendPage(stop, work context.Context, msgs []producer.Message, res *SweepResult) error {
	groups := groupByTopic(msgs)

	var (
		mu    sync.Mutex
		dbErr error
		wg    sync.WaitGroup
		sem   = make(chan struct{}, s.cfg.Concurrency)
	)
	for _, g := range groups {
		if stop.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			tr, err := s.sendTopic(stop, work, g.topic, g.msgs)
			mu.Lock()
			defer mu.Unlock()
			res.Dispatched += tr.dispatched
			res.Batches += tr.batches
			res.Skipped += tr.skipped
			if tr.failed {
				res.FailedBatches++
				res.FailedTopics = append(res.FailedTopics, g.topic)
			}
			if err != nil && dbErr == nil {
				dbErr = err
			}
		})
	}
	wg.Wait()
	return dbErr
}

type topicResult struct {
	batches, dispatched, skipped int
	failed                       bool
}

// sendTopic sends one topic's messages of a page, batch after batch, and stops at
// the first failed batch so that a later batch never overtakes an earlier one.
func (s *Sweeper) sendTopic(stop, work context.Context, topic string, msgs []producer.Message) (topicResult, error) {
	var tr topicResult
	batches, err := s.producer.Batches(work, topic, msgs)
	if err != nil {
		bad := producer.MessageIDs(err)
		if len(bad) == 0 {
			// Nothing of the topic can be cut: count it as a failed send of the
			// whole page of the topic, so the rows carry the error.
			all := producer.Batch{Topic: topic, Messages: msgs}
			out, dbErr := s.store.dispatch(work, all, func(context.Context, producer.Batch) error { return err })
			tr.failed = true
			s.logFailure(topic, all, out.claimed, err)
			return tr, dbErr
		}
		// Some messages can never be sent: record the failure on them, and send
		// the rest.
		rejected := subset(producer.Batch{Topic: topic, Messages: msgs}, slices.Sorted(slices.Values(bad)))
		out, dbErr := s.store.dispatch(work, rejected, func(context.Context, producer.Batch) error { return err })
		s.logFailure(topic, rejected, out.claimed, err)
		if dbErr != nil {
			return tr, dbErr
		}
	}

	for _, b := range batches {
		if stop.Err() != nil {
			break
		}
		out, dbErr := s.store.dispatch(work, b, s.producer.Send)
		if out.claimed > 0 {
			tr.batches++
		}
		tr.skipped += len(b.Messages) - out.claimed
		if dbErr != nil {
			return tr, dbErr
		}
		if out.sendErr != nil {
			tr.failed = true
			s.logFailure(topic, b, out.claimed, out.sendErr)
			return tr, nil
		}
		tr.dispatched += out.claimed
		if s.logger.Enabled(work, slog.LevelDebug) {
			s.logger.Debug("batch dispatched", "topic", topic, "num_rows", out.claimed,
				"first_id", b.Messages[0].ID, "last_id", b.Messages[len(b.Messages)-1].ID,
				"correlation_ids", correlationIDs(b, maxLoggedIDs))
		}
	}
	return tr, nil
}

// maxLoggedIDs bounds the correlation ids on one log line.
const maxLoggedIDs = 10

func (s *Sweeper) logFailure(topic string, b producer.Batch, claimed int, err error) {
	level := slog.LevelWarn
	if producer.ClassOf(err) == producer.ClassLocal {
		level = slog.LevelInfo // shutting down: nothing is wrong
	}
	s.logger.Log(context.Background(), level, "batch failed; topic stops until the next tick",
		"topic", topic, "class", producer.ClassOf(err).String(), "num_rows", claimed,
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
