package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/producer"
)

// RecheckDatabasesDefault is how often Databases reads its list again unasked.
const RecheckDatabasesDefault = 10 * time.Second

// DatabasesOptions configure [Databases].
type DatabasesOptions struct {
	// Fleet is every database's fleet's configuration (its schemas pattern,
	// sweepers, maintenance). Its Admin is served once, for all databases,
	// with each outbox under /outboxes/{database}.{schema}/.
	Fleet Options

	// URLs returns the databases' connection strings, one per database,
	// read at start, on Reload and every Recheck. An error keeps the
	// databases relayed as they are. A database is named by its name in
	// the string, or by the name before a URL written name=postgres://…:
	// databases on several servers may share a name (each tenant's server
	// holding "app"), and the names must differ (ListedName).
	URLs func() ([]string, error)

	// PoolConfig parses a connection string into the pool of its database;
	// its MaxConns is that database's budget, less the LISTEN session. Nil:
	// pgxpool.ParseConfig with MaxConns 9.
	PoolConfig func(url string) (*pgxpool.Config, error)

	// Recheck is how often URLs is called unasked, so that an edited list
	// takes effect without a signal. Defaults to RecheckDatabasesDefault.
	Recheck time.Duration
}

// Databases relays the outboxes of several databases, the
// database-per-tenant application's: a Fleet each, with a pool, a LISTEN
// session and a budget each, sharing the producer, the broker breaker and
// the admin API. Databases come and go as the list does.
type Databases struct {
	opts     DatabasesOptions
	producer producer.Producer
	reload   chan struct{}

	mu     sync.Mutex
	fleets map[string]*database // by connection string

	// refused holds, by connection string, why each database listed and not
	// relayed was not, as last logged: a refusal is logged when it comes or
	// changes, not at every reading of the list. Run's alone.
	refused map[string]string

	backlogWarning backlogWarning
}

// database is one database's fleet while it runs.
type database struct {
	name  string // the database's name, unique among them
	pool  *pgxpool.Pool
	fleet *Fleet
	stop  context.CancelFunc
	done  chan struct{}
}

// NewDatabases returns a relay of the databases opts.URLs lists, to p.
func NewDatabases(p producer.Producer, opts DatabasesOptions) (*Databases, error) {
	if p == nil || opts.URLs == nil {
		return nil, errors.New("fleet: a producer and the databases' URLs are required")
	}
	opts.Recheck = cmp.Or(opts.Recheck, RecheckDatabasesDefault)
	opts.Fleet = opts.Fleet.withDefaults()
	if err := opts.Fleet.check(); err != nil {
		return nil, err
	}
	if opts.PoolConfig == nil {
		opts.PoolConfig = func(url string) (*pgxpool.Config, error) {
			cfg, err := pgxpool.ParseConfig(url)
			if err == nil {
				cfg.MaxConns = 9
			}
			return cfg, err
		}
	}
	return &Databases{opts: opts, producer: p, reload: make(chan struct{}, 1), fleets: map[string]*database{}, refused: map[string]string{}}, nil
}

// Reload reads the list of databases again now (the CLI calls it on
// SIGHUP).
func (d *Databases) Reload() {
	select {
	case d.reload <- struct{}{}:
	default:
	}
}

// Names returns the names of the databases relayed now, sorted.
func (d *Databases) Names() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, db := range d.fleets {
		out = append(out, db.name)
	}
	slices.Sort(out)
	return out
}

// Pools returns the pools of the databases relayed now, each that
// database's connection budget less its LISTEN session
// (metrics.RegisterPools).
func (d *Databases) Pools() []*pgxpool.Pool {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*pgxpool.Pool, 0, len(d.fleets))
	for _, db := range d.fleets {
		out = append(out, db.pool)
	}
	return out
}

// Fleet returns the fleet of the database named name.
func (d *Databases) Fleet(name string) (*Fleet, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, db := range d.fleets {
		if db.name == name {
			return db.fleet, true
		}
	}
	return nil, false
}

// Run relays until ctx is done, then stops every database's fleet and
// returns nil. The producer stays the caller's to close.
func (d *Databases) Run(ctx context.Context) error {
	logger := d.opts.Fleet.Logger
	if base := d.opts.Fleet.Admin; base.Addr != "" {
		waitAdmin, err := admin.StartFleet(ctx, admin.FleetConfig{Base: base, TableName: d.opts.Fleet.Sweeper.Table.Name,
			Outboxes: d.adminOutboxes, Ready: d.ready})
		if err != nil {
			return err
		}
		defer waitAdmin()
		logger.Info("admin API listening", "addr", base.Addr, "token", base.Token != "", "outboxes_at", "/outboxes/{database}.{schema}/")
	}
	defer d.stopAll()
	failing := false
	for {
		err := d.sync(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !failing:
			logger.Error("reading the list of databases failed; the databases relayed go on as they are, and the list is read again",
				"err", err, "retry_in", d.opts.Recheck)
		case err == nil && failing:
			logger.Info("the list of databases reads again")
		}
		failing = err != nil
		t := time.NewTimer(d.opts.Recheck)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-d.reload:
		case <-t.C:
		}
		t.Stop()
	}
}

// sync stops the fleets of the databases no longer listed, then starts a
// fleet for each database listed and not relayed. In that order: a database
// listed again under another URL (its password rotated, a parameter added)
// is the same database, and its old fleet, still running, would make its
// name taken. It returns the list's error alone: a database that cannot be
// relayed is logged by itself.
func (d *Databases) sync(ctx context.Context) error {
	urls, err := d.opts.URLs()
	if err != nil {
		return err
	}
	listed := map[string]bool{}
	for _, u := range urls {
		listed[u] = true
	}
	d.mu.Lock()
	var gone []*database
	for u, db := range d.fleets {
		if !listed[u] {
			gone = append(gone, db)
			delete(d.fleets, u)
		}
	}
	d.mu.Unlock()
	// At once: a halt waits for its database's sends in flight (up to the
	// send timeout), and one database's slow broker must not hold up the
	// others' letting go. The databases listed since wait for the slowest
	// halt (its sends, up to the send timeout): a changed URL must not be
	// relayed twice, by its old fleet and its new, at once.
	var halting sync.WaitGroup
	for _, db := range gone {
		d.opts.Fleet.Logger.Info("database no longer listed as it was (taken off, or its URL or name changed); its outboxes are let go", "database", db.name)
		halting.Go(db.halt)
	}
	halting.Wait()
	for u := range d.refused {
		if !listed[u] {
			delete(d.refused, u)
		}
	}
	for _, u := range urls {
		d.mu.Lock()
		_, running := d.fleets[u]
		d.mu.Unlock()
		if running {
			continue
		}
		err := d.start(ctx, u)
		switch {
		case err == nil:
			delete(d.refused, u)
		case ctx.Err() != nil:
		case d.refused[u] != err.Error():
			// The list was read: this entry alone is left out, the others
			// relayed (and one refused since the last reading is logged too,
			// not hidden behind an earlier refusal still standing).
			d.refused[u] = err.Error()
			d.opts.Fleet.Logger.Error("a listed database is not relayed; the others are, and it is tried again at each reading of the list",
				"err", err, "retry_in", d.opts.Recheck)
		}
	}
	return nil
}

// ListedName splits an entry of the list of databases into the name the
// relay gives the database and its connection string. An entry
// name=postgres://… (or postgresql://, in any case, spaces around the =
// allowed) names it; a URL alone or a keyword=value string leaves name
// empty: the database is then named by its own name in the string. A name
// is letters, digits, _ and -, at most 63 bytes, as it goes into the admin
// API's paths, the destination's {database} and the Redis keys. An entry
// that looks named but whose URL is not a postgres:// one is refused,
// rather than read as a keyword=value string that would send the URL, its
// password too, to whatever server the defaults name; a URL's scheme is
// given back in lower case, for the same reason (lowerScheme).
func ListedName(entry string) (name, conn string, err error) {
	entry = strings.TrimSpace(entry)
	if postgresURL(entry) {
		return "", lowerScheme(entry), nil // a password may hold "=postgres://"
	}
	before, after, ok := strings.Cut(entry, "=")
	before, after = strings.TrimSpace(before), strings.TrimSpace(after)
	named := ok && nameLike(before)
	switch {
	case named && postgresURL(after):
		return before, lowerScheme(after), nil
	case named && (strings.Contains(after, "://") || hasPrefixFold(after, "postgres:") || hasPrefixFold(after, "postgresql:")) &&
		!strings.ContainsAny(after, " \t"):
		return "", "", fmt.Errorf("the listed database named %q is not a postgres:// or postgresql:// URL: write name=postgres://host/database", before)
	case ok && postgresURL(after):
		return "", "", fmt.Errorf("a listed database is named %q (before its URL's =): a name is letters, digits, _ and -, at most 63 bytes", before)
	}
	return "", entry, nil
}

// lowerScheme returns postgres URL s with its scheme in lower case: the
// driver tells a URL from a keyword=value string by a prefix in lower case
// alone, and read POSTGRES://user:password@host/db?sslmode=require as one
// unknown parameter, sent, password and all, to the server its defaults
// name.
func lowerScheme(s string) string {
	scheme, rest, _ := strings.Cut(s, "://")
	return strings.ToLower(scheme) + "://" + rest
}

func postgresURL(s string) bool {
	return hasPrefixFold(s, "postgres://") || hasPrefixFold(s, "postgresql://")
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// nameLike says whether s is a name ListedName takes.
func nameLike(s string) bool {
	return s != "" && len(s) <= 63 && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
	})
}

// start relays the database at entry.
func (d *Databases) start(ctx context.Context, entry string) error {
	name, url, err := ListedName(entry)
	if err != nil {
		return err
	}
	cfg, err := d.opts.PoolConfig(url)
	if err != nil {
		return fmt.Errorf("a listed database: %w", err) // the error names no password: pgconn redacts it
	}
	name = cmp.Or(name, cfg.ConnConfig.Database)
	if name == "" {
		return fmt.Errorf("a listed database on %s has no name in its connection string (dbname=…): give it, or name it in the list, name=postgres://…", cfg.ConnConfig.Host)
	}
	if sep := databaseSeparator(d.opts.Fleet.Destination); sep != "" && strings.Contains(name, sep) {
		// Database shop's topic eu.orders and database shop.eu's topic
		// orders would both go to shop.eu.orders under {database}.{topic}.
		return fmt.Errorf("the listed database %q holds %q, which the destination template %q puts after the database's name: "+
			"its tenants' destinations could be another database's; name it in the list without %q (name=postgres://…)",
			name, sep, d.opts.Fleet.Destination, sep)
	}
	d.mu.Lock()
	for _, db := range d.fleets {
		if db.name == name {
			d.mu.Unlock()
			return fmt.Errorf("two listed databases are named %q (on %s and another): the admin API names outboxes by database and schema, "+
				"so each database's name must be unique in the list; name them in the list, one name=postgres://… a line (eu1=postgres://host/%s)",
				name, cfg.ConnConfig.Host, cfg.ConnConfig.Database)
		}
	}
	d.mu.Unlock()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("database %s: %w", name, err)
	}
	opts := d.opts.Fleet
	opts.Admin.Addr = "" // served once, by Run
	opts.Logger = opts.Logger.With("database", name)
	opts.Database = name
	f, err := New(pool, d.producer, opts)
	if err != nil {
		pool.Close()
		return fmt.Errorf("database %s: %w", name, err)
	}
	runCtx, stop := context.WithCancel(ctx)
	db := &database{name: name, pool: pool, fleet: f, stop: stop, done: make(chan struct{})}
	d.mu.Lock()
	d.fleets[entry] = db
	d.mu.Unlock()
	go func() {
		defer close(db.done)
		_ = f.Run(runCtx)
	}()
	opts.Logger.Info("database relayed")
	return nil
}

// databaseSeparator returns the text template d puts right after
// {database}, up to its next placeholder: "" if it names no database. A
// database whose name holds it would make its destinations ambiguous.
func databaseSeparator(d producer.Destination) string {
	_, after, ok := strings.Cut(string(d), "{database}")
	if !ok {
		return ""
	}
	if i := strings.IndexByte(after, '{'); i >= 0 {
		after = after[:i]
	}
	return after
}

// halt stops the database's fleet and closes its pool.
func (db *database) halt() {
	db.stop()
	<-db.done
	db.pool.Close()
}

func (d *Databases) stopAll() {
	d.mu.Lock()
	all := slices.Collect(maps.Values(d.fleets))
	d.fleets = map[string]*database{}
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, db := range all {
		wg.Go(db.halt)
	}
	wg.Wait()
}

// States reports how each outbox of every database stands, for its
// per-outbox series (metrics.RegisterOutboxes).
func (d *Databases) States() []metrics.OutboxState { return states(d.adminOutboxes()) }

// Backlogs reads the backlogs of the outboxes named, of every database, for
// their per-outbox series (metrics.RegisterOutboxes).
func (d *Databases) Backlogs(ctx context.Context, names []string) (map[string]metrics.Backlog, error) {
	return backlogs(ctx, d.opts.Fleet.Sweeper.Table.Name, d.adminOutboxes(), names, &d.backlogWarning, d.opts.Fleet.Logger)
}

func (d *Databases) adminOutboxes() []admin.FleetOutbox {
	d.mu.Lock()
	all := slices.Collect(maps.Values(d.fleets))
	d.mu.Unlock()
	var out []admin.FleetOutbox
	for _, db := range all {
		out = append(out, db.fleet.adminOutboxes()...)
	}
	return out
}

// ready answers /readyz: nil while some listed database answers, the pings
// all at once, within ctx. One tenant database down (its maintenance, its
// server's restart) is that tenant's trouble: the others are relayed, and
// its sweeps' failures, its LISTEN session and its metrics say so. Made the
// whole process's, it held every rollout of the relay until that database
// came back, and one database slow to answer used up the probe's time for
// all. Each one that does not answer is logged by name; when none answers,
// the process cannot work (its network, its credentials), and it is not ready.
func (d *Databases) ready(ctx context.Context) error {
	d.mu.Lock()
	all := slices.Collect(maps.Values(d.fleets))
	d.mu.Unlock()
	if len(all) == 0 {
		// Every entry refused (the log says why each), or the list not read
		// yet: nothing is relayed.
		return errors.New("no listed database is relayed yet: the log says why each entry was left out, or the list could not be read")
	}
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, db := range all {
		wg.Go(func() {
			if err := db.pool.Ping(ctx); err != nil {
				errs[i] = fmt.Errorf("database %s: %w", db.name, err)
			}
		})
	}
	wg.Wait()
	var down []error
	for _, err := range errs {
		if err != nil {
			down = append(down, err)
		}
	}
	if len(down) > 0 && len(down) == len(all) {
		return errors.Join(down...)
	}
	for _, err := range down {
		d.opts.Fleet.Logger.Warn("a listed database does not answer; its tenants wait, the others are relayed, and /readyz stays ready while any database answers", "err", err)
	}
	return nil
}
