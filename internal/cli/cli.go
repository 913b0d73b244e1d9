// Package cli is the sweeper binary's command line: it parses flags and their
// OUTBOX_ environment variables, builds the pieces, runs a command, and picks the
// exit code. cmd/sweeper only hands it the process's arguments, streams and
// signals, so tests drive every command through [Main].
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"reflect"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/lmittmann/tint"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/robfig/cron/v3"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/relay"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1 // the command ran and failed: database unreachable, migration error
	ExitUsage   = 2 // a bad flag, variable or value
)

// DatabaseURLDefault is the database the sweeper uses when none is given: the
// local Postgres of a development machine.
const DatabaseURLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// poolSize is the run command's pool: the sweeper's three (a drain's two page
// transactions at once, its lanes, and a tick's expiry pass beside them; the
// topic list comes before them), retention, the probe, the admin API (two),
// the metrics refresh and a spare. docs/concepts.md counts it against
// max_connections (under "Tripped topics", beside the claim).
const poolSize = 9

// Version is set at build time with -ldflags "-X …/internal/cli.Version=v1.2.3".
var Version = ""

// Env is how Main reads the environment; os.LookupEnv in the binary.
type Env func(string) (string, bool)

func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

// common holds the flags every database command takes.
type common struct {
	databaseURL string
	schema      string
	table       string
}

func (c *common) register(f *flags) {
	f.String(&c.databaseURL, "database-url", DatabaseURLDefault, "url",
		"Postgres connection URL (or key=value DSN) of the database holding the outbox")
	f.String(&c.schema, "schema", outbox.SchemaDefault, "name", "schema of the outbox table")
	f.String(&c.table, "table", outbox.TableDefault, "name",
		"outbox table name; its dead-letter table is <table>_dead_letter")
}

// logOptions are the flags of long-running commands, which log.
type logOptions struct {
	logFormat string
	logLevel  string
}

func (l *logOptions) register(f *flags) {
	f.Enum(&l.logFormat, "log-format", "text", []string{"text", "json"},
		"log format on stderr: text (human, coloured on a terminal) or json (one object a line)")
	f.Enum(&l.logLevel, "log-level", "info", []string{"debug", "info", "warn", "error"},
		"least severe log level written; debug logs every batch")
}

func (c *common) tableName(f *flags) (outbox.Table, error) {
	if err := oneOutboxOfMany(f); err != nil {
		return outbox.Table{}, err
	}
	t := outbox.Table{Schema: c.schema, Name: c.table}
	if err := t.Validate(); err != nil {
		return t, f.configError(err)
	}
	return t, nil
}

func (l *logOptions) logger(w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(l.logLevel)) // the flag accepts valid levels only
	if l.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: forJSON}))
	}
	return slog.New(tint.NewHandler(w, &tint.Options{
		Level:       level,
		TimeFormat:  logTimeFormat,
		NoColor:     !isTerminal(w),
		ReplaceAttr: escapeInvalid,
	}))
}

// logTimeFormat is the text log's time: to the millisecond, with the zone's
// offset, so lines from machines in different zones (or a laptop and a
// server) line up.
const logTimeFormat = "2006-01-02 15:04:05.000 Z07:00"

// forJSON makes JSON logs read as log pipelines expect: durations in seconds
// (slog writes nanosecond integers), empty lists as [] (not null), and text
// that is not UTF-8 escaped (escapeInvalid).
func forJSON(groups []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindDuration:
		a.Value = slog.Float64Value(a.Value.Duration().Seconds())
	case slog.KindAny:
		if v := reflect.ValueOf(a.Value.Any()); v.Kind() == reflect.Slice && v.IsNil() {
			a.Value = slog.AnyValue([]any{})
		}
	}
	return escapeInvalid(groups, a)
}

// escapeInvalid writes string values that are not valid UTF-8 (a topic from a
// SQL_ASCII database, say) with their bad bytes as \xHH escapes: tint drops
// everything from the first bad byte and JSON turns each into U+FFFD, and
// either way the log would name another topic than the one in the table.
func escapeInvalid(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindString && !utf8.ValidString(a.Value.String()) {
		q := strconv.QuoteToASCII(a.Value.String())
		a.Value = slog.StringValue(q[1 : len(q)-1])
	}
	return a
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// poolConfig parses the database URL and names the application, so an operator
// looking at pg_stat_activity sees which sessions are the sweeper's.
func (c *common) poolConfig(origin string) (*pgxpool.Config, error) {
	if strings.TrimSpace(c.databaseURL) == "" {
		// pgx reads "" as libpq's defaults: the local socket, as the OS user,
		// into the database of that name, which a migrate would then change.
		return nil, usagef("%s is empty: give the outbox's database, e.g. %s (the default when it is not set at all)", origin, DatabaseURLDefault)
	}
	cfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return nil, usagef("invalid %s: %v", origin, err)
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "outbox-sweeper"
	}
	return cfg, nil
}

// cronParser accepts standard five-field specs, an optional leading seconds
// field, and descriptors such as @every 2s or @hourly.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// oneOutboxOfMany refuses a command of one outbox (dlq, migrate status) run
// in a relay of many's environment without naming its outbox: there
// OUTBOX_SCHEMAS (or a list of databases) says which outboxes the relay
// serves, and the command, which takes no such variable, read public.outbox
// of the default database instead, silently (an independent review).
func oneOutboxOfMany(f *flags) error {
	if f.lookupEnv == nil || f.fs.Lookup("schemas") != nil {
		return nil
	}
	for _, name := range []string{"schemas", "databases", "databases-file"} {
		v, ok := f.lookupEnv(envName(name))
		if !ok || strings.TrimSpace(v) == "" {
			continue
		}
		if name == "schemas" && f.set("schema") || name != "schemas" && f.set("database-url") {
			continue
		}
		what := "name the tenant's schema with --schema"
		if name != "schemas" {
			what = "name the tenant's database with --database-url (and its schema with --schema)"
		}
		return usagef("%s is set, so this environment is a relay of many outboxes, and this command acts on one: %s", envName(name), what)
	}
	return nil
}

// parseSchedule reads flag name's cron spec. A spec that parses but never
// fires (February 30th: '0 0 30 2 *') is refused too: it started cleanly,
// and the sweeps, or retention, never ran (an independent review).
func parseSchedule(f *flags, name, spec string) (cron.Schedule, error) {
	s, err := cronParser.Parse(spec)
	if err != nil {
		return nil, usagef("invalid value %q for %s: %v; write a cron spec such as \"*/10 * * * * *\" or \"@every 2s\"", spec, f.origin(name), err)
	}
	if s.Next(time.Now()).IsZero() {
		return nil, usagef("invalid value %q for %s: it never fires (no such day in the next five years); write a cron spec such as \"*/10 * * * * *\" or \"@every 2s\"", spec, f.origin(name))
	}
	return s, nil
}

// runOptions are the flags of run.
type runOptions struct {
	adminAddr      string
	adminHosts     string
	adminToken     string
	adminTokenFile string
	adminUI        bool
	common
	logOptions
	producerOptions
	topicBreakerOptions
	maintenanceOptions
	fleetOptions
	concurrency      int
	deadLetterLimit  int
	deadLetterWindow time.Duration
	maxAttempts      int
	maxAge           time.Duration
	topicMaxAge      map[string]time.Duration
	stallTicks       int
	degradedDead     int
	metricsTopics    int
	statusTopics     int
	notify           bool
	ordering         string
	pageSize         int
	schedule         string
	sendTimeout      time.Duration
	shutdownTimeout  time.Duration
	tick             time.Duration
}

func (o *runOptions) flags() *flags {
	f := newFlags("run")
	o.common.register(f)
	o.logOptions.register(f)
	o.producerOptions.register(f)
	o.topicBreakerOptions.register(f)
	o.maintenanceOptions.register(f)
	o.fleetOptions.register(f)
	f.String(&o.adminAddr, "admin-addr", admin.AddrDefault, "host:port", "where the admin HTTP API listens (health, readiness, metrics, tripped topics, breaker, dead letters); empty turns it off")
	adminTokenFlags(f, &o.adminToken, &o.adminTokenFile, "bearer token the admin API requires (but for /healthz, /readyz, /metrics); required to listen beyond loopback; printable ASCII, no spaces")
	f.String(&o.adminHosts, "admin-allowed-hosts", "", "host,…", "names, besides --admin-addr's, by which clients call the admin API (a proxy's, a Service's); requests naming another Host are refused (DNS rebinding); IP literals are served unless --admin-addr is loopback")
	f.Int(&o.stallTicks, "stall-ticks", 60, "/healthz fails (so Kubernetes restarts the process) when a sweep has made no progress (no statement or send returned) for more than this many ticks and twice --send-timeout plus 5s; a failing sweep returns, and is not stalled")
	f.Int(&o.degradedDead, "degraded-dead-letters", admin.DegradedDeadLettersDefault, "GET /status says degraded above this many dead letters (-1: never); an open broker breaker or a tripped topic always does")
	f.Int(&o.statusTopics, "status-topics", admin.StatusTopicsDefault, "most topics GET /status and the console list: those in trouble first, then the deepest backlogs, then the busiest; the rest are counted")
	f.Int(&o.metricsTopics, "metrics-max-topics", metrics.MaxTopicsDefault, `most topics with series of their own in the per-topic metrics; the others are counted under topic="_other"`)
	f.Bool(&o.adminUI, "admin-ui", true, "serve the console, a web page over the admin API, at / of --admin-addr (it asks for the token)")
	f.Int(&o.concurrency, "concurrency", outbox.ConcurrencyDefault, "topics sent at once; the batches of one topic go in order")
	f.Int(&o.deadLetterLimit, "dead-letter-limit", outbox.DeadLetterLimitDefault, "storm guard: more rows of one topic dead-lettered within --dead-letter-window stop dead-lettering, trip the topic and alert (-1: off)")
	f.Duration(&o.deadLetterWindow, "dead-letter-window", outbox.DeadLetterWindowDefault, "the storm guard's window")
	f.Int(&o.maxAttempts, "max-attempts", outbox.MaxAttemptsDefault, "transient failures after which a row is dead-lettered as max_retries_exceeded (-1: never)")
	f.Duration(&o.maxAge, "max-age", 0, "rows older than this (from created_at) are never sent: they are dead-lettered as expired, tripped topic or broker down alike (0: no max age)")
	f.TopicDurations(&o.topicMaxAge, "topic-max-age", "per-topic --max-age, e.g. codes=5m,prices=1m,events=never (never exempts a topic from --max-age)")
	f.Bool(&o.notify, "notify", true, "sweep as soon as rows are committed (LISTEN for the outbox's trigger on a connection of its own); --notify=false polls on the schedule only")
	f.Enum(&o.ordering, "ordering", string(outbox.OrderingTopic), []string{string(outbox.OrderingTopic), string(outbox.OrderingNone)},
		"topic: each topic is sent by one sweeper at a time, in id order, across instances; none: instances share a topic, which may then arrive out of order")
	f.Int(&o.pageSize, "page-size", outbox.PageSizeDefault, "most outstanding rows read per page; memory use is bounded by it")
	f.String(&o.schedule, "schedule", "", "spec", `cron spec for ticks instead of --tick, e.g. "*/10 * * * * *" or "@every 2s"`)
	f.Duration(&o.sendTimeout, "send-timeout", outbox.SendTimeoutDefault, "longest a broker may take to accept one batch; then the batch fails as transient")
	f.Duration(&o.shutdownTimeout, "shutdown-timeout", outbox.ShutdownTimeoutDefault, "on SIGTERM, how long batches in flight may take to finish")
	f.Duration(&o.tick, "tick", outbox.TickDefault, "interval between sweeps; a sweep drains a backlog page after page")
	return f
}

// sweeperConfig returns the sweeper's config the flags set, validated.
func (o *runOptions) sweeperConfig(f *flags) (outbox.Config, error) {
	tbl, err := o.tableName(f)
	if err != nil {
		return outbox.Config{}, err
	}
	cfg := outbox.Config{
		DeadLetterLimit:  o.deadLetterLimit,
		DeadLetterWindow: o.deadLetterWindow,
		MaxAttempts:      o.maxAttempts,
		MaxAge:           o.maxAge,
		TopicMaxAge:      o.topicMaxAge,
		Concurrency:      o.concurrency,
		DisableNotify:    !o.notify,
		Ordering:         outbox.Ordering(o.ordering),
		PageSize:         o.pageSize,
		SendTimeout:      o.sendTimeout,
		ShutdownTimeout:  o.shutdownTimeout,
		Table:            tbl,
		Tick:             o.tick,
		TopicBackoffMax:  o.topicBackoffMax,
	}
	if o.schedule != "" && f.overrides("tick", "schedule") {
		o.schedule = "" // --tick typed over OUTBOX_SCHEDULE: the command line wins
	}
	if o.schedule != "" {
		if f.set("tick") && !f.overrides("schedule", "tick") {
			return outbox.Config{}, usagef("%s %s and %s %q are both set: use one", f.origin("tick"), o.tick, f.origin("schedule"), o.schedule)
		}
		s, err := parseSchedule(f, "schedule", o.schedule)
		if err != nil {
			return outbox.Config{}, err
		}
		cfg.Schedule = s
	}
	// Validate before defaults fill in zeros: a flag set to 0 is a mistake to
	// report, not a request for the default.
	if err := cfg.Validate(); err != nil {
		return outbox.Config{}, f.configError(err)
	}
	return cfg, nil
}

// adminConfig returns the admin API's config the flags set, validated; with
// --admin-addr empty it serves none, and its flags are checked all the same.
// It checks --metrics-max-topics too, for /metrics, where it always was.
func (o *runOptions) adminConfig(f *flags) (admin.Config, error) {
	if o.stallTicks < 2 {
		return admin.Config{}, usagef("%s is %d: it must be at least 2 (a sweep lasts up to a tick and a page)", f.origin("stall-ticks"), o.stallTicks)
	}
	if o.degradedDead == 0 || o.degradedDead < -1 {
		return admin.Config{}, usagef("%s is %d: it must be at least 1, or -1 to never say degraded for dead letters", f.origin("degraded-dead-letters"), o.degradedDead)
	}
	if o.statusTopics < 1 {
		return admin.Config{}, usagef("%s is %d: it must be at least 1", f.origin("status-topics"), o.statusTopics)
	}
	if o.metricsTopics < 1 {
		return admin.Config{}, usagef("%s is %d: it must be at least 1", f.origin("metrics-max-topics"), o.metricsTopics)
	}
	token, err := adminToken(f, o.adminToken, o.adminTokenFile)
	if err != nil {
		return admin.Config{}, err
	}
	hosts, err := allowedHosts(f, o.adminHosts)
	if err != nil {
		return admin.Config{}, err
	}
	if o.adminAddr != "" {
		if err := admin.CheckAddr(o.adminAddr, token); err != nil {
			return admin.Config{}, usagef("%s: %v", f.origin("admin-addr"), err)
		}
	}
	return admin.Config{Addr: o.adminAddr, Token: token, AllowedHosts: hosts, UI: o.adminUI, DegradedDeadLetters: o.degradedDead,
		StatusTopics: o.statusTopics}, nil
}

func runCommand(ctx context.Context, o *runOptions, f *flags, out, errOut io.Writer) error {
	cfg, err := o.sweeperConfig(f)
	if err != nil {
		return err
	}
	tbl := cfg.Table
	adminCfg, err := o.adminConfig(f)
	if err != nil {
		return err
	}
	poolCfg, err := o.poolConfig(f.origin("database-url"))
	if err != nil {
		return err
	}
	// Three for the sweeper (each of a drain's two page transactions holds
	// one across its sends, whatever --concurrency, and a tick's expiry pass
	// takes one beside them), one each for retention and the probe, two for
	// the admin API, one for the metrics refresh, and a spare.
	poolCfg.MaxConns = poolSize
	logger := o.logger(errOut)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.NewWithConfig(reg, metrics.Config{MaxTopics: o.metricsTopics})
	m.SetBuildInfo(version())
	syncAlerter, notifier, err := o.maintenanceOptions.alerters(f, logger, m)
	if err != nil {
		return err
	}
	ownNotifier := true // until the relay runs, which closes it
	defer func() {
		if !ownNotifier {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		notifier.Close(ctx)
	}()
	alerter := alert.Alerter(notifier)
	// No cfg.Alerter: a storm trips its topic, and the topic breaker's change
	// hook alerts that, with the storm's summary as the reason. One alert.
	tracer, stopTracing, err := tracing(ctx, logger)
	if err != nil {
		return err
	}
	defer func() {
		// Flush the spans of the last batches, within the time a stop has.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := stopTracing(sctx); err != nil {
			logger.Warn("tracing: spans not exported at stop", "error", err)
		}
	}()
	cfg.Tracer = tracer
	tick := o.tick
	if cfg.Schedule != nil {
		now := time.Now()
		tick = cfg.Schedule.Next(now).Sub(now)
	}
	if o.schemas == "" && o.databasesFile == "" && o.databases == "" {
		for _, name := range []string{"max-connections", "destination", "reconcile", "metrics-outboxes", "awake-rate"} {
			switch {
			case !f.set(name):
			case name == "max-connections":
				return usagef("%s works with --schemas, --databases-file or --databases only (a relay of many outboxes); a relay of one uses %d connections", f.origin(name), poolSize+2)
			default:
				return usagef("%s works with --schemas, --databases-file or --databases only (a relay of many outboxes): leave it out", f.origin(name))
			}
		}
	} else {
		adminCfg.Metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
		return o.runFleet(ctx, f, cfg, adminCfg, poolCfg, logger, reg, m, alerter, syncAlerter, tick, out)
	}
	if cfg.TopicBreaker, err = o.topicBreakerOptions.build(f, logger, alerter, m.OnTopicChange, tbl.String(), tick, o.sendTimeout); err != nil {
		return err
	}

	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	metrics.RegisterPool(reg, pool)
	adminCfg.Metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	opts := relay.Options{Sweeper: cfg, Admin: adminCfg, Logger: logger, Metrics: m, Notifier: notifier,
		ProducerName: o.name, StallTicks: o.stallTicks}
	if err := o.maintenanceOptions.services(f, &opts, syncAlerter); err != nil {
		return err
	}

	p, dep, retry, err := o.producerOptions.buildGuarded(ctx, f, out, logger, alerter, m)
	if err != nil {
		return err
	}
	defer func() { _ = dep.Close(context.WithoutCancel(ctx)) }() // the relay closes it first when it runs
	opts.Dependency, opts.Sweeper.Retry = dep, retry
	connectEarly(ctx, p, o.name, logger)

	r, err := relay.New(pool, p, opts)
	if err != nil {
		_ = p.Close(ctx)
		if _, ok := errors.AsType[*outbox.ConfigError](err); ok {
			return &usageError{msg: err.Error()}
		}
		return err
	}
	logger.Info("starting", "version", version(), "producer", o.name,
		"database", redact(poolCfg.ConnConfig), "table", tbl.String())
	ownNotifier = false
	return r.Run(ctx)
}

// redact names the database without its password.
func redact(c *pgx.ConnConfig) string {
	return fmt.Sprintf("%s@%s:%d/%s", c.User, c.Host, c.Port, c.Database)
}

// migrateOptions are migrate's flags.
type migrateOptions struct {
	common
	schemas string
}

func migrateFlags(o *migrateOptions) *flags {
	f := newFlags("migrate")
	o.common.register(f)
	f.String(&o.schemas, "schemas", "", "pattern",
		"migrate the outbox of every existing schema matching this pattern (tenant_*; * ? [a-z] as in shell globs) instead of --schema's, each on its own, reporting each")
	return f
}

// connect opens one connection to the database the flags name, for the
// commands that need a session of their own (migrate's advisory lock).
func (c *common) connect(ctx context.Context, f *flags) (*pgx.Conn, outbox.Table, error) {
	tbl, err := c.tableName(f)
	if err != nil {
		return nil, tbl, err
	}
	poolCfg, err := c.poolConfig(f.origin("database-url"))
	if err != nil {
		return nil, tbl, err
	}
	connectCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(connectCtx, poolCfg.ConnConfig)
	if err != nil {
		return nil, tbl, fmt.Errorf("connect to %s: %w (is Postgres running, and is --database-url right?)", redact(poolCfg.ConnConfig), err)
	}
	return conn, tbl, nil
}

func migrateCommand(ctx context.Context, o *migrateOptions, f *flags, out, _ io.Writer) error {
	if o.schemas != "" && f.set("schema") {
		return usagef("%s and %s both name the outboxes: give one", f.origin("schema"), f.origin("schemas"))
	}
	if _, err := path.Match(o.schemas, ""); err != nil {
		return usagef("invalid pattern %q for %s: use * for any run of characters, ? for one, [a-z] for a range (e.g. tenant_*)", o.schemas, f.origin("schemas"))
	}
	conn, tbl, err := o.connect(ctx, f)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if o.schemas == "" {
		return migrateOne(ctx, conn, tbl, out)
	}
	rows, err := conn.Query(ctx, `SELECT nspname FROM pg_catalog.pg_namespace
		WHERE nspname NOT IN ('pg_catalog', 'information_schema') AND nspname NOT LIKE 'pg\_%' ORDER BY 1`)
	if err != nil {
		return fmt.Errorf("list the schemas: %w", err)
	}
	schemas, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("list the schemas: %w", err)
	}
	var migrated, failed int
	for _, s := range schemas {
		if ok, _ := path.Match(o.schemas, s); !ok {
			continue
		}
		t := outbox.Table{Schema: s, Name: tbl.Name}
		if err := t.Validate(); err != nil {
			// Validate names --schema, which this command was not given.
			if ce, ok := errors.AsType[*outbox.ConfigError](err); ok && ce.Flag == "schema" {
				ce.Flag = "schemas"
			}
			fmt.Fprintf(out, "%s: left out: %v\n", s, err)
			failed++
			continue
		}
		if err := migrateOne(ctx, conn, t, out); err != nil {
			if ctx.Err() != nil {
				return err
			}
			fmt.Fprintf(out, "%s: failed: %v\n", t, err)
			failed++
			continue
		}
		migrated++
	}
	switch {
	case failed > 0:
		return fmt.Errorf("%d of %d schemas matching %q failed to migrate (listed above); the others are migrated, and migrate can run again", failed, failed+migrated, o.schemas)
	case migrated == 0:
		return usagef("no schema matches %s %q: create the tenants' schemas first (migrate makes the outbox tables in them, not the schemas)", f.origin("schemas"), o.schemas)
	}
	fmt.Fprintf(out, "%d schemas matching %q migrated or up to date\n", migrated, o.schemas)
	return nil
}

func migrateOne(ctx context.Context, conn *pgx.Conn, tbl outbox.Table, out io.Writer) error {
	res, err := outbox.Migrate(ctx, conn, tbl)
	if err != nil {
		return err
	}
	if res.Newer {
		fmt.Fprintf(out, "%s is at schema version %d, newer than this sweeper's %d (a newer sweeper migrated it): nothing to apply; this sweeper relays it as it is\n",
			tbl, res.To, outbox.SchemaVersion())
		return nil
	}
	if len(res.Applied) == 0 {
		fmt.Fprintf(out, "%s is up to date at schema version %d\n", tbl, res.To)
		return nil
	}
	fmt.Fprintf(out, "%s migrated from schema version %d to %d (%s)\n", tbl, res.From, res.To, strings.Join(res.Applied, ", "))
	return nil
}
