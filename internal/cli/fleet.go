package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/fleet"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/relay"
)

// MaxConnectionsDefault is --max-connections' default: the connections a
// relay of many outboxes opens to the database, its LISTEN session among them.
const MaxConnectionsDefault = 10

// fleetOptions are the flags of a relay of many outboxes (--schemas).
type fleetOptions struct {
	schemas        string
	maxConnections int
	destination    string
	reconcile      time.Duration
}

func (o *fleetOptions) register(f *flags) {
	f.String(&o.schemas, "schemas", "", "pattern",
		"relay the outbox of every schema matching this pattern (tenant_*; * ? [a-z] as in shell globs) instead of --schema's alone: one LISTEN session and --max-connections in all, new tenants picked up within 10s, dropped ones let go")
	f.Int(&o.maxConnections, "max-connections", MaxConnectionsDefault,
		"with --schemas: the most connections the relay opens to the database, its LISTEN session included, however many tenants are busy (at least 3)")
	f.String(&o.destination, "destination", string(producer.DestinationDefault), "template",
		"with --schemas: the name each tenant's topic is sent under; {schema}.{topic} puts the tenant's schema before the topic when tenants share a broker's namespace")
	f.Duration(&o.reconcile, "reconcile", fleet.ReconcileDefault,
		"with --schemas: how often the idle tenants' outboxes are checked for rows whose notification was lost (one statement per 100 tenants)")
}

// runFleet is the run command with --schemas: a fleet over every matching
// schema's outbox, in place of a relay of one.
func (o *runOptions) runFleet(ctx context.Context, f *flags, cfg outbox.Config, adminCfg admin.Config, poolCfg *pgxpool.Config,
	logger *slog.Logger, m *metrics.Metrics, alerter, syncAlerter alert.Alerter, tick time.Duration, out io.Writer) error {
	switch {
	case f.set("schema"):
		return usagef("%s and %s both name the outboxes: give one (--schemas relays every schema matching its pattern)", f.origin("schema"), f.origin("schemas"))
	case o.redisURL != "":
		return usagef("%s does not work with %s yet: each tenant's topic breaker is kept in memory; leave it out", f.origin("redis-url"), f.origin("schemas"))
	case !o.notify:
		return usagef("%s does not work with %s: an idle tenant sweeps only when its commit notifies the relay (or at --reconcile); leave it on", f.origin("notify"), f.origin("schemas"))
	case o.maxConnections < 3:
		return usagef("%s is %d: it must be at least 3 (the LISTEN session, a sweep's page transaction and expiry pass)", f.origin("max-connections"), o.maxConnections)
	case o.reconcile < time.Second:
		return usagef("%s is %s: it must be at least 1s", f.origin("reconcile"), o.reconcile)
	}
	if err := producer.Destination(o.destination).Validate(); err != nil {
		return usagef("%s: %v", f.origin("destination"), err)
	}
	var ropts relay.Options
	if err := o.maintenanceOptions.services(f, &ropts, syncAlerter); err != nil {
		return err
	}
	next := ropts.RetentionSchedule.Next(time.Now())
	maintenance := ropts.RetentionSchedule.Next(next).Sub(next)

	p, err := o.producerOptions.build(f, out, logger)
	if err != nil {
		return err
	}
	dep, retry, err := o.producerOptions.guard(f, alerter, m)
	if err != nil {
		_ = p.Close(ctx)
		return err
	}
	defer func() { _ = dep.Close(context.WithoutCancel(ctx)) }()
	cfg.BrokerBreaker, cfg.Retry, cfg.Observer = dep, retry, m
	adminCfg.Dependency = dep
	connectEarly(ctx, p, o.name, logger)

	// The LISTEN session is the budget's last connection.
	poolCfg.MaxConns = int32(o.maxConnections - 1)
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		_ = p.Close(ctx)
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	fl, err := fleet.New(pool, p, fleet.Options{
		Schemas: o.schemas,
		Sweeper: cfg,
		TopicBreaker: func(t outbox.Table, logger *slog.Logger) (breaker.Breaker, error) {
			return o.topicBreakerOptions.build(f, logger, alerter, m, t, tick, o.sendTimeout)
		},
		Retention:   ropts.Retention,
		Probe:       ropts.Probe,
		Maintenance: maintenance,
		Destination: producer.Destination(o.destination),
		Reconcile:   o.reconcile,
		Logger:      logger,
		Admin:       adminCfg,
		StallTicks:  o.stallTicks,
	})
	if err != nil {
		_ = p.Close(ctx)
		if _, ok := errors.AsType[*outbox.ConfigError](err); ok {
			return f.configError(err)
		}
		return err
	}
	logger.Info("starting", "version", version(), "producer", o.name, "database", redact(poolCfg.ConnConfig),
		"schemas", o.schemas, "table", cfg.Table.Name, "max_connections", o.maxConnections, "destination", o.destination)
	return fl.Run(ctx)
}
