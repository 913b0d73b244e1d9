// Package relay is the outbox sweeper as one service: the sweeper, retention,
// the dead-letter probe, the metrics refresh and the admin API, started
// together and stopped together, with the broker breaker, the alert notifier
// and the producer closed once nothing sends through them any more.
//
// The sweeper binary is flag parsing around a [Relay] (internal/cli); an
// application that would rather relay from its own process builds one the
// same way (see the example). Package outbox holds the parts; this package
// only composes them, so outbox never depends on the admin API.
//
// Run's lifecycle, for a SIGTERM or any end of its context:
//
//	Run ──► admin API listening ──► retention, probe, metrics refresh ──► sweeper
//	ctx done ──► sweeper stops taking pages, lets batches in flight finish
//	        ──► producer closed ──► services stopped ──► admin API stopped
//	        ──► broker breaker closed ──► notifier flushed ──► Run returns
package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
)

// Defaults for [Options].
const (
	MetricsRefreshDefault    = 15 * time.Second
	ProbeScheduleDefault     = time.Minute
	RetentionScheduleDefault = time.Minute
	StallTicksDefault        = 60
)

// closeTimeout bounds closing the producer and flushing the notifier at the
// end of Run.
const closeTimeout = 10 * time.Second

// Options configure a [Relay]. The zero value of each field means its default:
// a relay with zero Options sweeps public.outbox on a one-second tick, deletes
// dispatched rows after outbox.RetentionDefault, probes the dead letters once
// a minute (alerting to Logger), and serves no admin API.
type Options struct {
	// Admin configures the admin HTTP API. An empty Admin.Addr serves none.
	// The relay fills in the parts it owns (Pool, Table, Topics, Dependency,
	// Gate, DeadLetters, Backoffs, Activity, Stalled, SweepsFailing); Admin.Logger
	// defaults to Logger. Metrics is the caller's: the handler of the
	// registry Metrics was made on, or nil for no /metrics.
	Admin admin.Config

	// Dependency is the broker circuit breaker: the sweeper asks it before
	// each send (it becomes Sweeper.BrokerBreaker) and the admin API shows
	// and steers it. Run closes it once nothing sends any more. Nil: no broker
	// breaker.
	Dependency *breaker.Dependency

	// Logger receives the logs of every part; a part's own logger in its
	// config, when set, wins. Defaults to discarding them.
	Logger *slog.Logger

	// Metrics, when set, observes the sweeper (Sweeper.Observer defaults to
	// it) and has its database gauges (backlog, dead letters, tripped topics)
	// refreshed every MetricsRefresh. Nil: no metrics.
	Metrics *metrics.Metrics

	// MetricsRefresh is the interval between refreshes of Metrics' database
	// gauges. Defaults to MetricsRefreshDefault.
	MetricsRefresh time.Duration

	// Notifier, when set, is closed last of all by Run, after the breakers
	// that alert through it, so that their last alerts go out. Nil: nothing
	// to close.
	Notifier *alert.Notifier

	// Probe configures the dead-letter probe. Its Table is Sweeper's; its
	// Alerter defaults to logging the alerts to Logger (alert.Log), its
	// Logger to Logger.
	Probe outbox.ProbeConfig

	// ProbeSchedule says when the probe runs. Defaults to every
	// ProbeScheduleDefault.
	ProbeSchedule outbox.Schedule

	// ProducerName names the producer in the relay's logs. Optional.
	ProducerName string

	// Retention configures the deletion of dispatched rows and old dead
	// letters. Its Table is Sweeper's; its Logger defaults to Logger.
	Retention outbox.RetentionConfig

	// RetentionSchedule says when retention runs. Defaults to every
	// RetentionScheduleDefault.
	RetentionSchedule outbox.Schedule

	// StallTicks is how many ticks a sweep may go without progress before
	// the admin API's /healthz fails (see outbox.Sweeper.Stalled). Defaults
	// to StallTicksDefault.
	StallTicks int

	// Sweeper configures the sweeper (see outbox.Config). Its Table names the
	// outbox every part of the relay serves; its Logger defaults to Logger.
	Sweeper outbox.Config
}

// withDefaults returns o with zero fields set to their defaults.
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MetricsRefresh == 0 {
		o.MetricsRefresh = MetricsRefreshDefault
	}
	if o.ProbeSchedule == nil {
		o.ProbeSchedule = outbox.Every(ProbeScheduleDefault)
	}
	if o.RetentionSchedule == nil {
		o.RetentionSchedule = outbox.Every(RetentionScheduleDefault)
	}
	if o.StallTicks == 0 {
		o.StallTicks = StallTicksDefault
	}
	o.Sweeper.Table = o.Sweeper.Table.WithDefaults()
	o.Sweeper.Logger = cmpOr(o.Sweeper.Logger, o.Logger)
	if o.Sweeper.Observer == nil && o.Metrics != nil {
		o.Sweeper.Observer = o.Metrics
	}
	if o.Dependency != nil {
		o.Sweeper.BrokerBreaker = o.Dependency
	}
	o.Retention.Table = o.Sweeper.Table
	if o.Retention.Ahead == 0 {
		// History partitions are made ready for twice the time between
		// runs, so that a run late or failed once still finds moves a
		// partition.
		next := o.RetentionSchedule.Next(time.Now())
		o.Retention.Ahead = 2 * o.RetentionSchedule.Next(next).Sub(next)
	}
	o.Retention.Logger = cmpOr(o.Retention.Logger, o.Logger)
	o.Probe.Table = o.Sweeper.Table
	o.Probe.Logger = cmpOr(o.Probe.Logger, o.Logger)
	if o.Probe.Alerter == nil {
		o.Probe.Alerter = alert.Log{Logger: o.Logger}
	}
	o.Admin.Logger = cmpOr(o.Admin.Logger, o.Logger)
	return o
}

// cmpOr is cmp.Or for loggers, which are not comparable as cmp.Or needs.
func cmpOr(l, fallback *slog.Logger) *slog.Logger {
	if l != nil {
		return l
	}
	return fallback
}

// Relay is the outbox sweeper as one service; [Relay.Run] runs it.
type Relay struct {
	opts      Options
	pool      *pgxpool.Pool
	producer  producer.Producer
	sweeper   *outbox.Sweeper
	retention *outbox.Retention
	probe     *outbox.Probe
	dead      *outbox.DeadLetters // nil without the admin API
}

// New returns a relay of pool's outbox (opts.Sweeper.Table) to p. It reports
// an invalid configuration, as an [*outbox.ConfigError] where a field is out of
// range. New starts nothing and takes nothing over: if Run is never called,
// the caller closes p, opts.Dependency and opts.Notifier. The relay takes
// connections from pool as the sweeper, retention, the probe, the metrics
// refresh and the admin API need them (one each at a time, two for the API,
// and up to three for the sweeper during a drain: its two page lanes and a
// tick's expiry pass; see outbox.NewSweeper); the pool stays the caller's to
// close after Run.
func New(pool *pgxpool.Pool, p producer.Producer, opts Options) (*Relay, error) {
	if pool == nil || p == nil {
		return nil, errors.New("relay: a pool and a producer are required")
	}
	opts = opts.withDefaults()
	r := &Relay{opts: opts, pool: pool, producer: p}
	var err error
	if r.sweeper, err = outbox.NewSweeper(pool, p, opts.Sweeper); err != nil {
		return nil, err
	}
	if r.retention, err = outbox.NewRetention(pool, opts.Retention); err != nil {
		return nil, err
	}
	if r.probe, err = outbox.NewProbe(pool, opts.Probe); err != nil {
		return nil, err
	}
	if opts.Admin.Addr != "" {
		if r.dead, err = outbox.NewDeadLetters(pool, opts.Sweeper.Table); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Sweeper returns the relay's sweeper, for what an embedding application
// wants to show of it (its topic breaker, its activity).
func (r *Relay) Sweeper() *outbox.Sweeper { return r.sweeper }

// Run serves the admin API, runs retention, the probe and the metrics refresh
// on their schedules, and sweeps, until ctx is done. Then the sweeper stops
// taking pages and lets the batches in flight finish (for up to
// Sweeper.ShutdownTimeout), and Run closes the producer, waits for the other
// parts to stop, closes the broker breaker and flushes the notifier, in that
// order, and returns nil. An admin API that cannot listen fails Run at once,
// with everything closed. Call Run once.
func (r *Relay) Run(ctx context.Context) error {
	defer r.closeAlerting(ctx)
	if r.opts.Admin.Addr != "" {
		// The API's own end, at Run's return whatever the cause: it served
		// until ctx was done, and a start refused (a schema without
		// history) waited for it, Run never returning, /healthz ok, the
		// error unsaid until someone stopped the process (an independent
		// review).
		adminCtx, stopAdmin := context.WithCancel(ctx)
		waitAdmin, err := admin.Start(adminCtx, r.adminConfig())
		if err != nil {
			stopAdmin()
			_ = r.producer.Close(ctx)
			return err
		}
		defer func() {
			stopAdmin()
			waitAdmin()
		}()
		r.opts.Logger.Info("admin API listening", "addr", r.opts.Admin.Addr, "token", r.opts.Admin.Token != "",
			"allowed_hosts", r.opts.Admin.AllowedHosts)
	}
	// The history partitions the moves need are made before the first page.
	// A schema that predates them stops the start: the sweeper could send
	// but never record a row as sent, and would send every row again and
	// again. Any other failure (the database not up yet) is retention's to
	// retry.
	prepCtx, cancelPrep := context.WithTimeout(ctx, 10*time.Second)
	err := r.retention.Prepare(prepCtx)
	cancelPrep()
	if errors.Is(err, outbox.ErrNoHistory) {
		_ = r.producer.Close(ctx)
		return err
	} else if err != nil {
		r.opts.Logger.Warn("history partitions not prepared; retention tries again at its next run, and meanwhile sent rows go to the DEFAULT partition", "err", err)
	}
	waitServices := r.startServices(ctx)
	defer waitServices()
	if err := r.sweeper.Run(ctx); err != nil {
		return err
	}
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	if err := r.producer.Close(closeCtx); err != nil {
		r.opts.Logger.Warn("closing the producer failed", "producer", r.opts.ProducerName, "err", err)
	}
	return nil
}

// adminConfig is Options.Admin with the parts the relay owns.
func (r *Relay) adminConfig() admin.Config {
	cfg := r.opts.Admin
	s := r.sweeper
	cfg.Pool, cfg.Table = r.pool, r.opts.Sweeper.Table
	cfg.Topics, cfg.Dependency, cfg.DeadLetters = s.TopicBreaker(), r.opts.Dependency, r.dead
	// The sweeper's gate is what /status says holds a topic: the answer its
	// sweeps act on and its log lines give, not one the API pieces together
	// from the breakers and the backoffs.
	cfg.Gate = s
	cfg.Backoffs, cfg.Activity = s.TopicBackoffs, s.TopicActivity
	cfg.Stalled = func(now time.Time) (outbox.Stall, bool) { return s.Stalled(now, r.opts.StallTicks) }
	cfg.SweepsFailing = s.Failing
	return cfg
}

// startServices runs retention, the probe and the metrics refresh on their
// schedules until ctx is done; the returned wait blocks until they have
// stopped.
func (r *Relay) startServices(ctx context.Context) (wait func()) {
	var wg sync.WaitGroup
	logger, tbl := r.opts.Logger, r.opts.Sweeper.Table
	if m := r.opts.Metrics; m != nil {
		topics := r.sweeper.TopicBreaker()
		wg.Go(func() {
			outbox.RunOnSchedule(ctx, outbox.Every(r.opts.MetricsRefresh), logger, "metrics refresh", func(ctx context.Context) error {
				// Bounded by its interval: a refresh that hung (a lock, a
				// connection gone silent) stopped every later one, the
				// gauges frozen and OutboxLagHigh blind (an independent
				// review, 2026-11-29).
				ctx, cancel := context.WithTimeout(ctx, max(r.opts.MetricsRefresh, time.Second))
				defer cancel()
				return m.Refresh(ctx, r.pool, tbl, topics)
			})
		})
	}
	wg.Go(func() {
		outbox.RunOnSchedule(ctx, r.opts.RetentionSchedule, logger, "retention", func(ctx context.Context) error {
			_, err := r.retention.RunOnce(ctx)
			return err
		})
	})
	wg.Go(func() {
		outbox.RunOnSchedule(ctx, r.opts.ProbeSchedule, logger, "dead-letter probe", func(ctx context.Context) error {
			_, err := r.probe.RunOnce(ctx)
			return err
		})
	})
	return wg.Wait
}

// closeAlerting closes the broker breaker, which delivers the changes it has
// seen, then the notifier they went to, which posts what it holds.
func (r *Relay) closeAlerting(ctx context.Context) {
	if r.opts.Dependency != nil {
		_ = r.opts.Dependency.Close(context.WithoutCancel(ctx))
	}
	if r.opts.Notifier != nil {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		r.opts.Notifier.Close(ctx)
	}
}
