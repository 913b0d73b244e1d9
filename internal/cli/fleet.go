package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

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
	databasesFile  string
	databases      string
	schemas        string
	maxConnections int
	destination    string
	reconcile      time.Duration
	metricsOutbox  string
	awakeRate      int
}

func (o *fleetOptions) register(f *flags) {
	f.String(&o.schemas, "schemas", "", "pattern",
		"relay the outbox of every schema matching this pattern (tenant_*; * ? [a-z] as in shell globs) instead of --schema's alone: one LISTEN session and --max-connections in all, new tenants picked up within 10s, dropped ones let go")
	f.String(&o.databasesFile, "databases-file", "", "path",
		"relay the outboxes of every database this file lists, one connection URL a line (# comments; name=postgres://… names a database whose name another server's shares), a database per tenant; read again on SIGHUP and every 10s; with --schemas, the matching schemas of each")
	f.String(&o.databases, "databases", "", "urls",
		"as --databases-file, the URLs given here, separated by spaces or newlines (postgres:// URLs, or name=postgres://…; a keyword=value connection string needs the file): for a list kept in a variable, OUTBOX_DATABASES")
	f.Int(&o.maxConnections, "max-connections", MaxConnectionsDefault,
		"with --schemas, --databases-file or --databases: the most connections the relay opens to each database, its LISTEN session included, however many tenants are busy (at least 3)")
	f.String(&o.destination, "destination", string(producer.DestinationDefault), "template",
		"with --schemas, --databases-file or --databases: the name each tenant's topic is sent under; {schema}.{topic} puts the tenant's schema before the topic when tenants share a broker's namespace, {database}.{topic} the database's name (a database per tenant, every outbox in public)")
	f.String(&o.metricsOutbox, "metrics-outboxes", "", "pattern",
		"with --schemas, --databases-file or --databases: the outboxes (by their admin API name, tenant_*) whose per-outbox series are exported always; others have them only while in trouble (a tripped topic, failing sweeps)")
	f.Int(&o.awakeRate, "awake-rate", fleet.AwakeRateDefault,
		"with --schemas, --databases-file or --databases: the commits a second above which a tenant's sweeper stays awake, polling every few milliseconds, so that its commits stop notifying; below it each commit notifies, and every notifying commit of the server queues for Postgres's notify lock, one disk flush each. Lower it (1: every tenant committing more often than every 50 ms) when many tenants together notify hundreds of times a second and the application's commit latency matters more than the relay's median and CPU")
	f.Duration(&o.reconcile, "reconcile", fleet.ReconcileDefault,
		"with --schemas, --databases-file or --databases: how often the idle tenants' outboxes are checked for rows whose notification was lost (the tables' insert counters in one statement; then one statement per 100 tenants asked: those whose counter moved, and the others in turn, each once in 120 passes, or in 10 if the relay's session reads track_counts off or the table is partitioned)")
}

// runFleet is the run command with --schemas: a fleet over every matching
// schema's outbox, in place of a relay of one.
func (o *runOptions) runFleet(ctx context.Context, f *flags, cfg outbox.Config, adminCfg admin.Config, poolCfg *pgxpool.Config,
	logger *slog.Logger, reg prometheus.Registerer, m *metrics.Metrics, alerter, syncAlerter alert.Alerter, tick time.Duration, out io.Writer) error {
	switch {
	case o.databasesFile != "" && f.set("database-url"):
		return usagef("%s and %s both name databases: give one", f.origin("database-url"), f.origin("databases-file"))
	case o.databases != "" && f.set("database-url"):
		return usagef("%s and %s both name databases: give one", f.origin("database-url"), f.origin("databases"))
	case o.databases != "" && o.databasesFile != "":
		return usagef("%s and %s both name databases: give one", f.origin("databases"), f.origin("databases-file"))
	case f.set("schema") && o.schemas == "":
		// A list of databases without --schemas: --schemas was not given.
		return usagef("%s names one outbox, and a list of databases relays every schema holding the table: give --schemas %s instead (a pattern; a plain name matches that schema alone)",
			f.origin("schema"), cfg.Table.Schema)
	case f.set("schema"):
		return usagef("%s and %s both name the outboxes: give one (--schemas relays every schema matching its pattern)", f.origin("schema"), f.origin("schemas"))
	case !o.notify:
		return usagef("%s does not work with %s: an idle tenant sweeps only when its commit notifies the relay (or at --reconcile); leave it on", f.origin("notify"), f.origin("schemas"))
	case o.maxConnections < 3:
		return usagef("%s is %d: it must be at least 3 (the LISTEN session, a sweep's page transaction and expiry pass)", f.origin("max-connections"), o.maxConnections)
	case o.reconcile < time.Second:
		return usagef("%s is %s: it must be at least 1s", f.origin("reconcile"), o.reconcile)
	case o.awakeRate < 1:
		return usagef("%s is %d: it must be at least 1 (commits a second)", f.origin("awake-rate"), o.awakeRate)
	}
	if err := producer.Destination(o.destination).Validate(); err != nil {
		return usagef("%s: %v", f.origin("destination"), err)
	}
	if _, err := path.Match(o.metricsOutbox, ""); err != nil {
		return usagef("invalid pattern %q for %s: use * for any run of characters, ? for one, [a-z] for a range (e.g. tenant_00*)", o.metricsOutbox, f.origin("metrics-outboxes"))
	}
	var keep func(string) bool // none named: only the outboxes in trouble
	if o.metricsOutbox != "" {
		keep = func(name string) bool {
			ok, _ := path.Match(o.metricsOutbox, name)
			return ok
		}
	}
	// The topic breaker's flags, and Redis's URL, are checked here, not when
	// the first tenant's breaker is made: a bad value would otherwise leave
	// every tenant out, one error each, the process running and relaying
	// none.
	if _, err := o.topicBreakerOptions.settings(f); err != nil {
		return err
	}
	if o.redisURL != "" {
		if _, err := o.redisClient(f, logger); err != nil {
			return err
		}
	}
	var ropts relay.Options
	if err := o.maintenanceOptions.services(f, &ropts, syncAlerter); err != nil {
		return err
	}
	next := ropts.RetentionSchedule.Next(time.Now())
	maintenance := ropts.RetentionSchedule.Next(next).Sub(next)

	// The table's gauges are a relay of one's: no fleet refreshes them.
	m.ForMany(reg)
	p, dep, retry, err := o.producerOptions.buildGuarded(ctx, f, out, logger, alerter, m)
	if err != nil {
		return err
	}
	defer func() { _ = dep.Close(context.WithoutCancel(ctx)) }()
	cfg.BrokerBreaker, cfg.Retry, cfg.Observer = dep, retry, m
	adminCfg.Dependency = dep
	connectEarly(ctx, p, o.name, logger)

	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := p.Close(closeCtx); err != nil {
			logger.Warn("closing the producer failed", "producer", o.name, "err", err)
		}
	}()
	opts := fleet.Options{
		Schemas: o.schemas,
		Sweeper: cfg,
		TopicBreaker: func(t outbox.Table, name string, logger *slog.Logger) (breaker.Breaker, error) {
			// name is the schema, or database.schema: with the table's name,
			// the key a relay of that table alone uses, the database first
			// where there are several.
			return o.topicBreakerOptions.build(f, logger, alert.Outbox{Alerter: alerter, Name: name}, m.OnTopicChange, name+"."+t.Name, tick, o.sendTimeout)
		},
		// Each database's LISTEN session its own view of the metrics:
		// outbox_listening counts them all, none set over the others.
		Session:     func(name string) fleet.SessionObserver { return m.Session(name) },
		Retention:   ropts.Retention,
		Probe:       ropts.Probe,
		Maintenance: maintenance,
		Destination: producer.Destination(o.destination),
		Reconcile:   o.reconcile,
		AwakeRate:   float64(o.awakeRate),
		Logger:      logger,
		Admin:       adminCfg,
		StallTicks:  o.stallTicks,
	}
	if o.databasesFile != "" || o.databases != "" {
		return o.runDatabases(ctx, f, p, opts, logger, reg, keep)
	}
	// The LISTEN session is the budget's last connection.
	poolCfg.MaxConns = int32(o.maxConnections - 1)
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	// The budget's use, as for a relay of one (outbox_db_pool_*).
	metrics.RegisterPool(reg, pool)
	fl, err := fleet.New(pool, p, opts)
	if err != nil {
		if _, ok := errors.AsType[*outbox.ConfigError](err); ok {
			return f.configError(err)
		}
		return err
	}
	metrics.RegisterOutboxes(reg, fl, keep, o.metricsTopics)
	logger.Info("starting", "version", version(), "producer", o.name, "database", redact(poolCfg.ConnConfig),
		"schemas", o.schemas, "table", cfg.Table.Name, "max_connections", o.maxConnections, "destination", o.destination)
	return fl.Run(ctx)
}

// runDatabases relays the databases --databases-file lists, a fleet each,
// reading the file again on SIGHUP and every 10 s.
func (o *runOptions) runDatabases(ctx context.Context, f *flags, p producer.Producer, opts fleet.Options, logger *slog.Logger,
	reg prometheus.Registerer, keep func(string) bool) error {
	d, err := fleet.NewDatabases(p, fleet.DatabasesOptions{
		Fleet: opts,
		URLs:  o.databaseURLs,
		PoolConfig: func(url string) (*pgxpool.Config, error) {
			c := o.common
			c.databaseURL = url
			source := f.origin("databases-file")
			if o.databases != "" {
				source = f.origin("databases")
			}
			cfg, err := c.poolConfig("URL listed in " + source)
			if err == nil {
				cfg.MaxConns = int32(o.maxConnections - 1) // the LISTEN session is the last
			}
			return cfg, err
		},
	})
	if err != nil {
		if _, ok := errors.AsType[*outbox.ConfigError](err); ok {
			return f.configError(err)
		}
		return err
	}
	metrics.RegisterOutboxes(reg, d, keep, o.metricsTopics)
	// Every database's budget, summed: as many series as one database's.
	metrics.RegisterPools(reg, d.Pools)
	urls, err := o.databaseURLs()
	if err != nil {
		name := "databases-file"
		if o.databases != "" {
			name = "databases"
		}
		return usagef("%s: %v", f.origin(name), err)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				logger.Info("SIGHUP: reading the list of databases again", "file", o.databasesFile)
				d.Reload()
			}
		}
	}()
	logger.Info("starting", "version", version(), "producer", o.name, "databases", len(urls), "databases_file", o.databasesFile,
		"schemas", cmp.Or(o.schemas, "*"), "max_connections_per_database", o.maxConnections, "destination", o.destination)
	return d.Run(ctx)
}

// databaseURLs returns the databases' connection strings: --databases', or
// --databases-file's, read again at each call.
func (o *fleetOptions) databaseURLs() ([]string, error) {
	if o.databases == "" {
		return readDatabasesFile(o.databasesFile)
	}
	urls := strings.Fields(o.databases)
	if len(urls) == 0 {
		return nil, errors.New("it lists no database: give connection URLs separated by spaces or newlines")
	}
	// A keyword=value connection string, split at its spaces, made pieces
	// that were each relayed as a database of their own, on the defaults'
	// server (an independent review, 2026-11-29).
	for _, u := range urls {
		if _, conn, err := fleet.ListedName(u); err == nil && !strings.HasPrefix(conn, "postgres://") && !strings.HasPrefix(conn, "postgresql://") {
			shown := redactURL(u)
			if k, _, ok := strings.Cut(u, "="); ok {
				shown = k + "=…" // a piece of a keyword=value string may be its password
			}
			return nil, fmt.Errorf("it lists %q, which is not a postgres:// URL: the list is split at spaces, so a keyword=value "+
				"connection string falls apart here; write it as a URL, or give it in --databases-file, one a line", shown)
		}
	}
	return urls, nil
}

// readDatabasesFile returns the connection strings of a --databases-file:
// one per line; blank lines and lines starting with # are skipped.
func readDatabasesFile(name string) ([]string, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var urls []string
	for line := range strings.Lines(string(data)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			urls = append(urls, line)
		}
	}
	if len(urls) == 0 {
		return nil, fmt.Errorf("%s lists no database: write one connection URL a line", name)
	}
	return urls, nil
}
