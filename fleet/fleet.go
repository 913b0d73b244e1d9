// Package fleet relays many outboxes of one database from one process: the
// schema-per-tenant application, whose every tenant schema holds an ordinary
// outbox of this project (migrated by `sweeper migrate --schemas`).
//
// What one sweeper per outbox would cost is what the fleet shares (ADR 0002):
//
//   - one LISTEN session for the database, whatever its number of outboxes:
//     the trigger's notification names the outbox a commit wrote to, and the
//     fleet wakes that outbox's sweeper alone. The same session holds the
//     awake locks of the outboxes whose commits come faster than their
//     sweeps, so that a busy tenant's commits stop notifying (outbox.AwakeHost);
//   - one pool, whose size is the relay's connection budget: sweeps take
//     turns (outbox.Host), at most as many at once as the pool holds without
//     a sweep ever waiting for a connection another sweep holds;
//   - no tick for an outbox that holds nothing: its sweeper parks after a
//     sweep that found no row, and costs no query until a commit wakes it;
//     a reconciliation pass, one statement per hundred parked outboxes every
//     Reconcile, wakes those whose notification was lost;
//   - retention and the dead-letter probe of an outbox run when it has swept
//     since their last run, and every IdleMaintenance otherwise.
//
// Each outbox keeps what is its own: its topic breaker, backoffs, dead
// letters, storm guard, cursor and expiry. Tenant A's tripped topic "orders"
// never holds tenant B's "orders". The broker, its producer and its breaker
// are shared: a broker that is down is down for every tenant.
package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
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
	DiscoverDefault        = 10 * time.Second
	ReconcileDefault       = 30 * time.Second
	IdleMaintenanceDefault = time.Hour
	MaintenanceDefault     = time.Minute
	AwakeRateDefault       = 100
)

// reconcileChunk is how many outboxes one reconciliation statement asks
// about: a statement of a thousand subqueries spends longer planning than
// running.
const reconcileChunk = 100

// fullReconcile is how many reconciliation passes ask every parked outbox
// once, whatever the statistics say (see reconcile): an hour's at the
// default Reconcile while Postgres counts inserts, fullReconcileUncounted
// while it does not (track_counts off), when the counts never move.
const (
	fullReconcile          = 120
	fullReconcileUncounted = 10
)

// Options configure a [Fleet]. The zero value of each field means its default.
type Options struct {
	// Schemas is the pattern, in path.Match's syntax (tenant_*, t_??,
	// [a-m]*), of the schemas whose outbox the fleet relays: those that hold
	// a table named Sweeper.Table.Name. Empty: every schema that does.
	Schemas string

	// Sweeper is the configuration every outbox's sweeper starts from. Its
	// Table.Name names the outbox table in each schema (Table.Schema is the
	// schema's); Logger, Host and TopicBreaker are the fleet's to set, and
	// TopicBreaker must be nil (see TopicBreaker). BrokerBreaker and Observer,
	// when set, are shared by every outbox.
	Sweeper outbox.Config

	// Session, when set, returns what is told of the fleet's LISTEN session
	// (name: Database, "" for a fleet of one database): the sessions of
	// several databases need one each (metrics.Session), or each would set
	// the one gauge over the others'.
	Session func(name string) SessionObserver

	// TopicBreaker returns the topic breaker of outbox t, which logs to
	// logger; name is the outbox's name in the admin API and in alerts,
	// which the breaker's alerts carry through alert.Outbox. Nil: each
	// outbox gets an in-memory breaker with breaker.Settings' defaults, as a
	// sweeper of its own would.
	TopicBreaker func(t outbox.Table, name string, logger *slog.Logger) (breaker.Breaker, error)

	// Database names the fleet's database when it is one of several
	// (Databases sets it): its outboxes are then named database.schema, in
	// the admin API and in alerts, rather than by their schema alone.
	Database string

	// Retention and Probe configure each outbox's retention and dead-letter
	// probe (their Table is the outbox's). Retention.Ahead defaults to twice
	// Maintenance. Probe.Alerter is required.
	Retention outbox.RetentionConfig
	Probe     outbox.ProbeConfig

	// Maintenance is how often the maintenance round runs: retention and the
	// probe of each outbox that swept since their last run. Defaults to
	// MaintenanceDefault.
	Maintenance time.Duration

	// IdleMaintenance is how often retention runs for an outbox that has not
	// swept (to drop its history partitions past the retention, and its old
	// dead letters), the idle outboxes' runs spread over it: an idle
	// outbox's sent rows are kept up to this much past their retention. The
	// probe has nothing to find there (rows are dead-lettered by sweeps) and
	// does not run. Defaults to IdleMaintenanceDefault.
	IdleMaintenance time.Duration

	// Destination names the destination of each outbox's topics at the
	// broker; its {database} is Database, or else the pool's database.
	// Defaults to producer.DestinationDefault, the topic alone.
	Destination producer.Destination

	// Discover is how often the schemas are listed again, to relay new
	// tenants and let dropped ones go. A notification from an outbox the
	// fleet does not know lists them at once. Defaults to DiscoverDefault.
	Discover time.Duration

	// Reconcile is how often the parked outboxes are checked for rows whose
	// notification was lost. Defaults to ReconcileDefault.
	Reconcile time.Duration

	// Logger receives the fleet's logs, and each outbox's with an outbox
	// attribute. Defaults to discarding them.
	Logger *slog.Logger

	// Admin configures the admin API (admin.FleetHandler): each outbox's
	// API under /outboxes/{schema}/, and GET /outboxes. The fleet fills in
	// each outbox's parts; Admin.Logger defaults to Logger. An empty
	// Admin.Addr serves none.
	Admin admin.Config

	// AwakeRate is the rate of commits, a second, above which a tenant
	// whose commits press its sweeper (they notify during its sweeps) stays
	// awake, holding its awake lock so that they stop notifying
	// (outbox.AwakeHost), until they slow under half of it. Below it each
	// commit notifies: an awake sweeper polls its outbox every few
	// milliseconds, and many slow tenants polling cost more than their
	// notifications. Every notifying commit of the server waits for
	// Postgres's notify lock, though: a lower rate keeps slow tenants awake,
	// for the application's commits' sake (the binary's --awake-rate).
	// Defaults to AwakeRateDefault.
	AwakeRate float64

	// StallTicks is how many ticks an outbox's sweep may go without
	// progress before /healthz fails (outbox.Sweeper.Stalled). Defaults to
	// 60.
	StallTicks int

	// turns is how many reconciliation passes ask every parked outbox in
	// turn: 0 is fullReconcile, below 0 none (for tests that prove what the
	// insert counts find alone).
	turns int
	// maintainEach bounds one outbox's retention and probe in a maintenance
	// round (maintainEachDefault when 0).
	maintainEach time.Duration
	// asking, when set, is called with the schemas a reconciliation pass
	// is about to ask (when it asks any), after their counts are read: for
	// a test that drops one of them there, so that its chunk fails.
	asking func(schemas []string)
}

func (o Options) withDefaults() Options {
	o.Sweeper.Table = o.Sweeper.Table.WithDefaults()
	o.Maintenance = cmp.Or(o.Maintenance, MaintenanceDefault)
	o.IdleMaintenance = cmp.Or(o.IdleMaintenance, IdleMaintenanceDefault)
	o.Discover = cmp.Or(o.Discover, DiscoverDefault)
	o.Reconcile = cmp.Or(o.Reconcile, ReconcileDefault)
	o.Destination = cmp.Or(o.Destination, producer.DestinationDefault)
	o.StallTicks = cmp.Or(o.StallTicks, 60)
	o.AwakeRate = cmp.Or(o.AwakeRate, AwakeRateDefault)
	if o.Retention.Ahead == 0 {
		// As a relay of one outbox: ready for two rounds. An idle outbox's
		// partitions may run out between its rare runs; the rows it sends
		// when it wakes go to the DEFAULT partition until the next round,
		// a Maintenance later, which retention empties.
		o.Retention.Ahead = 2 * o.Maintenance
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	// After the Logger's own default: the admin API's logs an outbox's calls
	// with it, and a nil one panicked at the first GET /outboxes or scrape.
	if o.Admin.Logger == nil {
		o.Admin.Logger = o.Logger
	}
	return o
}

// check refuses what no outbox could be relayed with, once, before any is
// found: each outbox's sweeper is made from these options when its schema
// is, and a bad value would leave every tenant out, one error each, while
// the relay ran relaying none (a list of databases, whose fleets are made
// as each is listed, would log it as the list's trouble every Recheck).
func (o Options) check() error {
	if o.Sweeper.TopicBreaker != nil {
		return errors.New("fleet: Sweeper.TopicBreaker is shared by every outbox; give Options.TopicBreaker instead, which makes one per outbox")
	}
	if _, err := path.Match(o.Schemas, ""); err != nil {
		return &outbox.ConfigError{What: "schema pattern", Flag: "schemas", Value: fmt.Sprintf("%q", o.Schemas),
			Want: "it is not a valid pattern: use * for any run of characters, ? for one, [a-z] for a range (e.g. tenant_*)"}
	}
	if err := o.Destination.Validate(); err != nil {
		return &outbox.ConfigError{What: "destination", Flag: "destination", Value: fmt.Sprintf("%q", o.Destination), Want: err.Error()}
	}
	check := o.Sweeper
	check.Table.Schema = outbox.SchemaDefault
	if err := check.WithDefaults().Validate(); err != nil {
		return err
	}
	if o.Probe.Alerter == nil {
		return errors.New("fleet: Probe.Alerter is required")
	}
	return nil
}

// Fleet relays every outbox of a database whose schema matches a pattern.
type Fleet struct {
	opts     Options
	pool     *pgxpool.Pool
	producer producer.Producer
	turns    *turns

	mu      sync.Mutex
	members map[string]*member // by the outbox's schema-qualified name
	// shared holds the members' topic breakers that are shared through
	// Redis, by the members' keys: the ones breakersTryAgain looks at. Kept
	// apart so that a fleet without Redis does not look at a thousand
	// members' breakers every second for none (a tenth of an idle fleet's
	// CPU, 2026-11-28).
	shared  map[string]sharedBreaker
	refused map[string]bool // schemas left out, logged once
	waiting map[string]bool // schemas whose migration has not finished, logged once
	listed  bool            // the first listing is done (and logged)

	// listener is the database's LISTEN session, which also holds the
	// awake locks of the outboxes sweeping on and on (outbox.AwakeHost).
	listener *outbox.Listener

	running     sync.WaitGroup // the sweepers' Runs, stopped ones too
	discoverNow chan struct{}
	// passes counts the reconciliation passes done (follow's alone writes
	// it; tests read it).
	passes      atomic.Int64
	reconcileAt atomic.Int64 // Unix nanoseconds of a full reconciliation asked for sooner; 0: none
	// reconcileNow wakes follow for reconcileAt: it otherwise sleeps until
	// the next listing or reconciliation is due.
	reconcileNow chan struct{}

	backlogWarning backlogWarning
}

// New returns a fleet relaying pool's outboxes to p. The pool's size is the
// connection budget: the fleet opens one more connection, its LISTEN session,
// and no other. New starts nothing; Run does. p stays the caller's to close
// after Run (several fleets may share it: Databases).
func New(pool *pgxpool.Pool, p producer.Producer, opts Options) (*Fleet, error) {
	if pool == nil || p == nil {
		return nil, errors.New("fleet: a pool and a producer are required")
	}
	opts = opts.withDefaults()
	if err := opts.check(); err != nil {
		return nil, err
	}
	f := &Fleet{
		opts:         opts,
		pool:         pool,
		producer:     p,
		turns:        newTurns(sweepsAtOnce(int(pool.Config().MaxConns))),
		members:      map[string]*member{},
		shared:       map[string]sharedBreaker{},
		refused:      map[string]bool{},
		waiting:      map[string]bool{},
		discoverNow:  make(chan struct{}, 1),
		reconcileNow: make(chan struct{}, 1),
	}
	f.listener = outbox.NewListener(pool.Config().ConnConfig.Copy(), opts.Logger, f.notified, func() {
		// What was committed while no one listened, or while the session
		// held an awake lock it lost, notified no one.
		f.reconcileAt.Store(time.Now().UnixNano())
		select {
		case f.reconcileNow <- struct{}{}:
		default:
		}
	})
	return f, nil
}

// sweepsAtOnce is how many sweeps may run at once in a pool of size
// connections: a sweep holds at most two (its page transaction, and a tick's
// expiry pass beside it), and one is kept for everything else (the listing
// of schemas, reconciliation, maintenance, the cursors' checks), which holds
// one at a time and waits for none while it does. So no sweep ever waits for
// a connection that another sweep holds while it waits in turn. Except in
// the smallest pool, 2 (--max-connections 3): its one sweep may hold both
// while a tick's expiry pass runs, and the rest wait for it to end (each
// does, on its own: no deadlock, only their delay).
func sweepsAtOnce(size int) int { return max(1, (size-1)/2) }

// Outboxes returns the outboxes the fleet relays now, sorted.
func (f *Fleet) Outboxes() []outbox.Table {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]outbox.Table, 0, len(f.members))
	for _, k := range slices.Sorted(maps.Keys(f.members)) {
		out = append(out, f.members[k].table)
	}
	return out
}

// Sweeper returns the sweeper of outbox t, and whether the fleet relays it.
func (f *Fleet) Sweeper(t outbox.Table) (*outbox.Sweeper, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.members[t.WithDefaults().String()]
	if !ok {
		return nil, false
	}
	return m.sweeper, true
}

// Run relays until ctx is done: it lists the schemas, starts a sweeper for
// each outbox, listens for commits, reconciles and maintains, and follows
// the schemas as tenants come and go. Then each sweeper lets its batches in
// flight finish (Sweeper.ShutdownTimeout), and Run returns nil. An admin API
// that cannot listen fails Run at once.
func (f *Fleet) Run(ctx context.Context) error {
	if f.opts.Admin.Addr != "" {
		base := f.opts.Admin
		base.Pool = f.pool
		waitAdmin, err := admin.StartFleet(ctx, admin.FleetConfig{Base: base, TableName: f.opts.Sweeper.Table.Name,
			Outboxes: f.adminOutboxes})
		if err != nil {
			return err
		}
		defer waitAdmin()
		f.opts.Logger.Info("admin API listening", "addr", base.Addr, "token", base.Token != "", "outboxes_at", "/outboxes/{schema}/")
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if f.opts.Session == nil {
			f.listener.Run(ctx)
			return
		}
		obs := f.opts.Session(f.opts.Database)
		f.listener.OnListening(obs.Listening)
		f.listener.Run(ctx)
		obs.Forget()
	})
	wg.Go(func() { f.maintain(ctx) })
	f.follow(ctx)
	wg.Wait()
	f.running.Wait()
	f.opts.Logger.Info("fleet stopped")
	return nil
}

// notified wakes the outbox a commit names; a name the fleet does not know
// that its pattern matches is a new tenant: the schemas are listed at once.
func (f *Fleet) notified(payload string) {
	f.mu.Lock()
	m := f.members[payload]
	f.mu.Unlock()
	if m != nil {
		m.notes.Add(1)
		m.signal()
		return
	}
	if schema, table, ok := strings.Cut(payload, "."); ok && table == f.opts.Sweeper.Table.Name && f.matches(schema) {
		// A schema left out for its name is looked at again only once it
		// is dropped and made again: its commits list nothing.
		f.mu.Lock()
		refused := f.refused[schema]
		f.mu.Unlock()
		if refused {
			return
		}
		f.listAgain()
	}
}

// listAgain has follow list the schemas soon (at most once a second), once
// however many ask before it does.
func (f *Fleet) listAgain() {
	select {
	case f.discoverNow <- struct{}{}:
	default:
	}
}

func (f *Fleet) matches(schema string) bool {
	if f.opts.Schemas == "" {
		return true
	}
	ok, _ := path.Match(f.opts.Schemas, schema)
	return ok
}

// follow lists the schemas every Discover (or at once when a notification
// names a new one) and reconciles every Reconcile (or at once when the
// LISTEN session comes back), until ctx is done.
func (f *Fleet) follow(ctx context.Context) {
	discover := time.Now()
	reconcile := time.Now().Add(f.opts.Reconcile)
	failing := false
	var listed time.Time // when the last listing began
	owed := false        // a full reconciliation failed: the next pass is full
	for {
		if !time.Now().Before(discover) {
			listed = time.Now()
			err := f.discover(ctx)
			switch {
			case ctx.Err() != nil:
				return
			case err != nil && !failing:
				f.opts.Logger.Error("listing the tenant schemas failed; the outboxes known go on, and the listing is tried again", "err", err, "retry_in", f.opts.Discover)
			case err == nil && failing:
				f.opts.Logger.Info("listing the tenant schemas works again")
			}
			failing = err != nil
			discover = time.Now().Add(f.opts.Discover)
		}
		if at := f.reconcileAt.Swap(0); at != 0 || !time.Now().Before(reconcile) {
			passes := f.passes.Load() + 1
			full := at != 0 || owed
			asked, err := f.reconcile(ctx, full, passes)
			// A full pass that could not ask (the database just back) is
			// owed still, at the next pass in time: the rows committed while
			// no one listened would otherwise wait for the passes in turn,
			// up to an hour. Not sooner: asked again at once, a pass that
			// failed every time ran again without a pause. An ask that
			// failed is its outbox's own, asked again at the next pass.
			owed = full && !asked
			if err != nil && ctx.Err() == nil {
				f.opts.Logger.Warn("reconciliation failed; it is tried again at its next time", "err", err)
			}
			f.passes.Store(passes)
			reconcile = time.Now().Add(f.opts.Reconcile)
		}
		next := min(time.Until(discover), time.Until(reconcile))
		if f.breakersTryAgain() {
			next = min(next, time.Second)
		}
		wait := time.NewTimer(next)
		select {
		case <-ctx.Done():
			wait.Stop()
			return
		case <-f.discoverNow:
			// At once, but not more than once a second: every commit of a
			// tenant that waits for its migration (a binary upgraded before
			// `sweeper migrate`, a thousand tenants) names a schema the fleet
			// does not relay, and each listing reads the schema version of
			// every such tenant.
			soonest := listed.Add(time.Second)
			if now := time.Now(); soonest.Before(now) {
				soonest = now
			}
			if soonest.Before(discover) {
				discover = soonest // never later than it was due
			}
		case <-f.reconcileNow:
		case <-wait.C:
		}
		wait.Stop()
	}
}

// sharedBreaker is a topic breaker shared through Redis (breaker.Redis),
// which works on local state while Redis does not answer.
type sharedBreaker interface {
	Degraded() bool
	TryAgain() (tried bool)
}

// breakersTryAgain has every outbox's breaker that works on local state try
// Redis again. A breaker tries at its outbox's ticks and plans, but a parked
// outbox has neither: a trip an operator made through it during a Redis
// outage would stay in this process until its next commit, whose sweep the
// other instances, on Redis, may win, and send the tripped topic's rows.
//
// The breakers share one Redis: once one has tried and still works on local
// state, Redis does not answer yet, and the others wait for the next pass
// (one that tried a moment ago at its own tick or plan is not tried again).
// A hung Redis then costs the pass one call's timeout, not one per outbox
// (a thousand tenants' breakers tried in turn would hold up discovery and
// reconciliation for minutes). The members come in the map's random order,
// so no one outbox's failure keeps the others from their turn.
//
// It reports whether any member's breaker is shared: only then does the
// fleet wake every second for it.
func (f *Fleet) breakersTryAgain() (shared bool) {
	f.mu.Lock()
	shared = len(f.shared) > 0
	var degraded []sharedBreaker
	for _, b := range f.shared {
		if b.Degraded() {
			degraded = append(degraded, b)
		}
	}
	f.mu.Unlock()
	for _, b := range degraded {
		if b.TryAgain() && b.Degraded() {
			return shared
		}
	}
	return shared
}

// discover lists the schemas holding the outbox table, starts a sweeper for
// each new one that matches, and stops those whose schema is gone.
func (f *Fleet) discover(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rows, err := f.pool.Query(qctx, `SELECT n.nspname, c.oid::bigint FROM pg_catalog.pg_class c
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = $1 AND c.relkind IN ('r', 'p')
		  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
		ORDER BY 1`, f.opts.Sweeper.Table.Name)
	if err != nil {
		return fmt.Errorf("list the schemas holding a table %q: %w", f.opts.Sweeper.Table.Name, err)
	}
	type listed struct {
		Schema string
		OID    int64
	}
	schemas, err := pgx.CollectRows(rows, pgx.RowToStructByPos[listed])
	if err != nil {
		return fmt.Errorf("list the schemas holding a table %q: %w", f.opts.Sweeper.Table.Name, err)
	}
	f.mu.Lock()
	before := len(f.members)
	f.mu.Unlock()
	found := map[string]bool{}
	// Outboxes are added addsAtOnce at a time: each is a few statements
	// (its schema version, its history partitions), and one after another
	// a restart of a relay of 1,000 tenants took 5 s to relay the last.
	var (
		adding sync.WaitGroup
		slots  = make(chan struct{}, addsAtOnce)
	)
	for _, l := range schemas {
		s := l.Schema
		if ctx.Err() != nil {
			break // the adds under way end too; nothing is let go
		}
		if !f.matches(s) {
			continue
		}
		t := outbox.Table{Schema: s, Name: f.opts.Sweeper.Table.Name}
		found[t.String()] = true
		f.mu.Lock()
		m, refused := f.members[t.String()], f.refused[s]
		if m != nil {
			f.madeAgain(m, l.OID)
		}
		f.mu.Unlock()
		if m != nil || refused {
			continue
		}
		slots <- struct{}{}
		adding.Go(func() {
			defer func() { <-slots }()
			f.added(ctx, t, f.add(ctx, t))
			f.mu.Lock()
			if m := f.members[t.String()]; m != nil {
				m.listedOID = l.OID // the table it was added for
			}
			f.mu.Unlock()
		})
	}
	adding.Wait()
	if ctx.Err() != nil {
		return nil
	}
	f.mu.Lock()
	var forget []goneOutbox // the outboxes gone whose breaker's state is shared
	for k, m := range f.members {
		if !found[k] {
			f.opts.Logger.Info("outbox gone (its schema or table was dropped); its sweeper stops", "outbox", k)
			m.stop()
			if b, ok := f.shared[k].(forgetter); ok {
				forget = append(forget, goneOutbox{member: m, breaker: b})
			}
			delete(f.members, k)
			delete(f.shared, k)
		}
	}
	// A dropped schema that comes back is looked at (and logged) again.
	gone := func(s string, _ bool) bool {
		return !found[(outbox.Table{Schema: s, Name: f.opts.Sweeper.Table.Name}).String()]
	}
	maps.DeleteFunc(f.refused, gone)
	maps.DeleteFunc(f.waiting, gone)
	if len(f.members) != before || !f.listed {
		f.opts.Logger.Info("relaying outboxes", "outboxes", len(f.members), "schemas", cmp.Or(f.opts.Schemas, "*"))
		f.listed = true
	}
	f.mu.Unlock()
	if len(forget) > 0 {
		// Not in the listing's way: a sweeper may take up to a send's
		// timeout to stop.
		f.running.Go(func() { f.forget(ctx, forget) })
	}
	return nil
}

// forgetter is a topic breaker whose state outlives the process
// (breaker.Redis): an outbox gone for good takes it with it.
type forgetter interface {
	Forget(ctx context.Context) error
}

// goneOutbox is an outbox let go whose breaker's state is shared.
type goneOutbox struct {
	*member
	breaker forgetter
}

// forget deletes the shared breaker state of outboxes gone, each once its
// sweeper has stopped (a trip or a tick of its last sweep would write it
// again) and if its table is still gone then (one made again meanwhile may
// hold trips of its own, made by other instances).
func (f *Fleet) forget(ctx context.Context, gone []goneOutbox) {
	for i, g := range gone {
		select {
		case <-g.stopped:
		case <-ctx.Done():
			return
		}
		var exists bool
		err := f.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c
			JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2)`,
			g.table.Schema, g.table.Name).Scan(&exists)
		if err == nil && exists {
			continue
		}
		if err == nil {
			err = g.breaker.Forget(ctx)
		}
		if err != nil && ctx.Err() == nil {
			// Redis (or the database) does not answer: the others would
			// each wait out the call's timeout too.
			names := make([]string, 0, len(gone)-i)
			for _, g := range gone[i:] {
				names = append(names, g.name)
			}
			f.opts.Logger.Warn("the topic breaker's state of outboxes gone stays in Redis: a schema made again under one of their names "+
				"starts with their tripped topics, which close after their cooldowns (or reset them: sweeper topics reset TOPIC --outbox NAME)",
				"outboxes", strings.Join(names, ","), "err", err)
			return
		}
	}
}

// addsAtOnce bounds the outboxes a listing adds at once.
const addsAtOnce = 4

// added records what adding outbox t came to.
func (f *Fleet) added(ctx context.Context, t outbox.Table, err error) {
	var unfinished *unfinishedError
	switch {
	case err == nil:
		f.mu.Lock()
		delete(f.waiting, t.Schema)
		f.mu.Unlock()
	case ctx.Err() != nil:
	case errors.As(err, &unfinished):
		// Its migration is under way (each step commits on its own), or
		// was never finished: looked at again at each listing.
		f.mu.Lock()
		if !f.waiting[t.Schema] {
			f.opts.Logger.Info("an outbox is not relayed yet; the fleet looks at it again at each listing", "outbox", t.String(), "err", err)
			f.waiting[t.Schema] = true
		}
		f.mu.Unlock()
	default:
		f.opts.Logger.Error("an outbox is left out", "outbox", t.String(), "err", err)
		f.mu.Lock()
		f.refused[t.Schema] = true
		f.mu.Unlock()
	}
}

// add starts relaying outbox t. An unfinishedError (its migration not done,
// or its history table missing) has it looked at again at each listing; any
// other error (a schema name the sweeper does not accept) leaves it out
// until its schema is dropped and made again, or the process restarts.
func (f *Fleet) add(ctx context.Context, t outbox.Table) error {
	if err := t.Validate(); err != nil {
		// A name --schema would refuse (Postgres allows more); the message
		// is about the schema found, not a flag.
		return fmt.Errorf("schema %q matches %q, but this relay takes only schema names of lower-case letters, digits and _ "+
			"(starting with a letter or _, at most 63 bytes): its outbox is not relayed; rename the schema, or narrow the pattern to leave it out",
			t.Schema, cmp.Or(f.opts.Schemas, "*"))
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	version, err := outbox.CurrentSchemaVersion(vctx, f.pool, t)
	cancel()
	if err != nil {
		return &unfinishedError{fmt.Errorf("read its schema version: %w", err)}
	}
	if want := outbox.SchemaVersion(); version < want {
		return &unfinishedError{fmt.Errorf("its schema version is %d of %d: run `sweeper migrate --schemas %s` (the relay picks it up within %s)",
			version, want, t.Schema, f.opts.Discover)}
	}
	logger := f.opts.Logger.With("outbox", t.String())
	m := &member{fleet: f, table: t, name: t.Schema, wake: make(chan struct{}, 1), awake: f.listener.AwakeLock(t)}
	if f.opts.Database != "" {
		m.name = f.opts.Database + "." + t.Schema
	}
	cfg := f.opts.Sweeper
	cfg.Table, cfg.Logger, cfg.Host = t, logger, m
	if cfg.Alerter != nil {
		cfg.Alerter = alert.Outbox{Alerter: cfg.Alerter, Name: m.name}
	}
	if f.opts.TopicBreaker != nil {
		b, err := f.opts.TopicBreaker(t, m.name, logger)
		if err != nil {
			return fmt.Errorf("topic breaker: %w", err)
		}
		cfg.TopicBreaker = b
	}
	p := f.producer
	if f.opts.Destination != producer.DestinationDefault {
		// {database} is the database's name as its URL gives it, in a list
		// of databases or not, or the name the list gives it (ListedName).
		p = producer.Renamed(p, f.opts.Destination.For(cmp.Or(f.opts.Database, f.pool.Config().ConnConfig.Database), t.Schema))
	}
	if m.sweeper, err = outbox.NewSweeper(f.pool, p, cfg); err != nil {
		return err
	}
	rc := f.opts.Retention
	rc.Table, rc.Logger = t, cmp.Or(rc.Logger, logger)
	if m.retention, err = outbox.NewRetention(f.pool, rc); err != nil {
		return err
	}
	if m.dead, err = outbox.NewDeadLetters(f.pool, t); err != nil {
		return err
	}
	pc := f.opts.Probe
	pc.Table, pc.Logger = t, cmp.Or(pc.Logger, logger)
	pc.Alerter = alert.Outbox{Alerter: pc.Alerter, Name: m.name}
	if m.probe, err = outbox.NewProbe(f.pool, pc); err != nil {
		return err
	}
	prepCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = m.retention.Prepare(prepCtx)
	cancel()
	if err != nil && ctx.Err() == nil && !errors.Is(err, outbox.ErrNoHistory) && !f.hasHistory(ctx, t) {
		// Relayed without its history table, its rows would be sent again
		// and again (recording them as sent fails): a failure that leaves
		// the table's existence unknown waits for the next listing too.
		return &unfinishedError{fmt.Errorf("history partitions not prepared, and its history table not found: %w", err)}
	}
	if errors.Is(err, outbox.ErrNoHistory) {
		// Its schema version is current (checked above), so the table was
		// dropped by hand, and migrate alone would not make it again:
		// looked at again at each listing, for when it is back.
		return &unfinishedError{fmt.Errorf("%w, though its schema version is current (dropped by hand?): its sent rows could not be recorded; "+
			"restore it, or set its schema version back to 9 (UPDATE %s SET version = 9) and run `sweeper migrate --schemas %s`, "+
			"whose migration 10 makes it if missing; the fleet picks the outbox up within %s",
			outbox.ErrNoHistory, outbox.VersionIdent(t), t.Schema, f.opts.Discover)}
	} else if err != nil && ctx.Err() == nil {
		logger.Warn("history partitions not prepared; maintenance tries again, and meanwhile sent rows go to the DEFAULT partition", "err", err)
	}
	// Spread the idle outboxes' maintenance over IdleMaintenance, rather
	// than run a thousand tenants' at one time every hour.
	m.maintained = time.Now().Add(-rand.N(f.opts.IdleMaintenance))
	runCtx, stop := context.WithCancel(ctx)
	m.stop, m.stopped = stop, make(chan struct{})
	f.mu.Lock()
	f.members[t.String()] = m
	if b, ok := cfg.TopicBreaker.(sharedBreaker); ok {
		f.shared[t.String()] = b
	}
	f.mu.Unlock()
	f.running.Go(func() {
		defer close(m.stopped)
		_ = m.sweeper.Run(runCtx)
	})
	logger.Debug("outbox relayed")
	return nil
}

// reconcile wakes the parked outboxes that hold an outstanding row: a
// notification lost (the LISTEN session was down) or never sent (a row
// written with triggers off, or put back by hand) would otherwise leave it
// waiting for good.
//
// Asking every parked outbox costs a statement per hundred of them, and
// planning a hundred-table statement costs 5 to 10 ms of the database's
// time, 40 to 57 ms in a session that has not opened those tables yet: at a
// tenth of a thousand tenants every 30 s, the largest part of an idle
// fleet's cost to the database (2026-11-28). So a pass first reads, in one
// statement of a few milliseconds, how many rows each outbox table has had
// inserted (Postgres's statistics, pg_stat_get_tuples_inserted), and asks
// the parked outboxes whose count moved since the last pass that found them
// parked. Statistics lag (a backend reports its counts within seconds of its
// commit) and may be reset (at a crash too): either moves the count by a
// later pass. The count is compared from the last pass that found the
// outbox parked, not the last pass: a row committed as its sweeper parked,
// whose notification was lost, moved the count at a pass that found it
// still awake. What the counts cannot see, a row written in a session that
// counts nothing (track_counts off), a pass in turn catches: each pass asks
// the parked outboxes at its place in name order (mod fullReconcile), so
// that each is asked at least once in fullReconcile passes, an hour's by
// default, or fullReconcileUncounted when the relay's own session reads
// track_counts off or the table is partitioned. An outbox whose ask failed,
// or that woke between its count and its ask, is asked again at the next
// pass that finds it parked. The pass after the LISTEN session (re)connects
// (full) asks every one. (Postgres 14 and older send their counts over UDP
// and may drop some under load: a row whose count was dropped, its
// notification lost too, waits for its turn.)
func (f *Fleet) reconcile(ctx context.Context, full bool, pass int64) (asked bool, err error) {
	// The whole pass is bounded, each ask within it too (ask).
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	qctx := ctx
	// A partitioned table's own count stays 0 (its partitions count): it is
	// asked in turn as often as an uncounted one.
	rows, err := f.pool.Query(qctx, `SELECT n.nspname, c.oid::bigint, pg_catalog.pg_stat_get_tuples_inserted(c.oid),
			pg_catalog.current_setting('track_counts')::bool AND c.relkind = 'r'
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = $1 AND c.relkind IN ('r', 'p')`, f.opts.Sweeper.Table.Name)
	if err != nil {
		return false, fmt.Errorf("read the outboxes' insert counts: %w", err)
	}
	type insertCount struct {
		oid, n   int64
		counting bool
	}
	inserted := map[string]insertCount{}
	var schema string
	var c insertCount
	if _, err := pgx.ForEachRow(rows, []any{&schema, &c.oid, &c.n, &c.counting}, func() error {
		inserted[schema] = c
		return nil
	}); err != nil {
		return false, fmt.Errorf("read the outboxes' insert counts: %w", err)
	}
	turns := f.opts.turns
	if turns == 0 {
		turns = fullReconcile
	}
	f.mu.Lock()
	var ask []*member
	for i, k := range slices.Sorted(maps.Keys(f.members)) {
		m := f.members[k]
		if !m.sweeper.Parked() {
			continue // awake, it finds its rows itself; its count is compared once it parks
		}
		ic, ok := inserted[m.table.Schema]
		// Never compared yet (added since, awake at every pass before, or
		// its last ask failed): asked once, as the count it starts from may
		// hold a lost row.
		if ok {
			// A table made again under the name (a tenant reset) starts its
			// count again, which may meet the old one's: told as the
			// listing tells it.
			f.madeAgain(m, ic.oid)
		}
		moved := ok && (!m.counted || m.inserted != ic.n)
		m.inserted, m.counted = ic.n, ok
		every := int64(turns)
		if ok && !ic.counting {
			every = min(every, fullReconcileUncounted)
		}
		inTurn := turns > 0 && int64(i)%every == pass%every
		if full || moved || inTurn {
			ask = append(ask, m)
		}
	}
	f.mu.Unlock()
	if f.opts.asking != nil && len(ask) > 0 {
		schemas := make([]string, len(ask))
		for i, m := range ask {
			schemas[i] = m.table.Schema
		}
		f.opts.asking(schemas)
	}
	var errs []error
	for chunk := range slices.Chunk(ask, reconcileChunk) {
		found, err := f.ask(ctx, chunk)
		if err != nil && len(chunk) > 1 {
			// One outbox failed the whole statement (a schema dropped since
			// the listing, a grant revoked, a table DDL holds): ask each
			// alone, so that its trouble stays its own. Asked together
			// again and again, its neighbours in name order were never
			// answered, their lost rows waiting for a commit that notified.
			found, err = nil, nil
			for i := range chunk {
				one, e := f.ask(ctx, chunk[i:i+1])
				if e != nil {
					f.compareAgain(chunk[i : i+1])
					errs = append(errs, fmt.Errorf("ask %s: %w", chunk[i].table, e))
					continue
				}
				if len(one) > 0 {
					found = append(found, i)
				}
			}
			f.listAgain()
		} else if err != nil {
			// A schema dropped since the last listing fails its ask: list
			// them again, and the next pass asks it again.
			f.listAgain()
			f.compareAgain(chunk)
			errs = append(errs, fmt.Errorf("ask %s: %w", chunk[0].table, err))
			continue
		}
		for _, i := range found {
			m := chunk[i]
			if !m.sweeper.Parked() {
				// It woke meanwhile and sweeps, but its row may lie below
				// its floors: it reads them all, and is asked again once
				// parked.
				m.sweeper.Recheck()
				f.compareAgain(chunk[i : i+1])
				continue
			}
			f.opts.Logger.Info("reconciliation found rows in a parked outbox (a notification was lost, or its commit notified nobody); it sweeps now", "outbox", m.table.String())
			m.sweeper.Recheck()
			m.signal()
		}
	}
	return true, errors.Join(errs...)
}

// ask returns the indexes of the outboxes of chunk that hold outstanding
// rows, in one statement. It gives up on a lock after 2 s and on the whole
// after reconcileAsk: a table that DDL holds (VACUUM FULL, an ALTER under
// way) once held the pass's every later chunk up to its 30 s, failing them
// all.
func (f *Fleet) ask(ctx context.Context, chunk []*member) ([]int, error) {
	ctx, cancel := context.WithTimeout(ctx, reconcileAsk)
	defer cancel()
	var q strings.Builder
	for i, m := range chunk {
		if i > 0 {
			q.WriteString(" UNION ALL ")
		}
		fmt.Fprintf(&q, "SELECT %d WHERE EXISTS (SELECT 1 FROM %s WHERE dispatched_at IS NULL)", i, m.table.Ident())
	}
	var found []int
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '2s'"); err != nil {
			return err
		}
		// Simple protocol: each text is asked once, so preparing it would
		// only add a round trip and a statement the connection keeps.
		rows, err := tx.Query(ctx, q.String(), pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			return err
		}
		found, err = pgx.CollectRows(rows, pgx.RowTo[int])
		return err
	})
	return found, err
}

// reconcileAsk bounds one statement of a reconciliation pass (ask).
const reconcileAsk = 10 * time.Second

// madeAgain tells m's sweeper, when its table's oid is not the one the
// listings and reconciliations read before, that its outbox was made again under its name (a
// tenant reset between two listings): the new table's ids start again from
// 1, below where the sweeper read the old one, so it reads every topic from
// its first row. Called under f.mu.
func (f *Fleet) madeAgain(m *member, oid int64) {
	if m.listedOID != oid {
		f.opts.Logger.Info("outbox made again under its name (a new table); its sweeper reads it from its first row", "outbox", m.table.String())
		m.sweeper.Recheck()
		m.signal()
	}
	m.listedOID = oid
}

// hasHistory reports whether t's history table is there; false if the
// look fails.
func (f *Fleet) hasHistory(ctx context.Context, t outbox.Table) bool {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var ok bool
	err := f.pool.QueryRow(qctx, "SELECT to_regclass($1) IS NOT NULL", outbox.HistoryIdent(t)).Scan(&ok)
	return err == nil && ok
}

// compareAgain has the next reconciliation that finds each of ms parked
// ask it, whatever its count.
func (f *Fleet) compareAgain(ms []*member) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range ms {
		m.counted = false
	}
}

// maintainEachDefault bounds one outbox's retention, and its probe, in a
// maintenance round.
const maintainEachDefault = time.Minute

// maintain runs, every Maintenance, retention and the probe of the outboxes
// whose sweeps moved rows since their last run, and retention alone of a
// share of the idle ones, so that each idle outbox has it once per
// IdleMaintenance (an idle outbox makes no dead letter for the probe).
func (f *Fleet) maintain(ctx context.Context) {
	outbox.RunOnSchedule(ctx, outbox.Every(f.opts.Maintenance), f.opts.Logger, "maintenance", func(ctx context.Context) error {
		f.mu.Lock()
		members := slices.Collect(maps.Values(f.members))
		f.mu.Unlock()
		now := time.Now()
		var busy, idle []*member
		for _, m := range members {
			switch {
			case m.touched.Swap(false):
				busy = append(busy, m)
			case now.Sub(m.maintained) >= f.opts.IdleMaintenance:
				idle = append(idle, m)
			}
		}
		slices.SortFunc(idle, func(a, b *member) int {
			return cmp.Or(a.maintained.Compare(b.maintained), strings.Compare(a.table.String(), b.table.String()))
		})
		quota := max(1, (len(members)*int(f.opts.Maintenance)+int(f.opts.IdleMaintenance)-1)/int(f.opts.IdleMaintenance))
		idle = idle[:min(len(idle), quota)]
		var errs []error
		for i, m := range append(busy, idle...) {
			if ctx.Err() != nil {
				return nil
			}
			m.maintained = now
			// Each outbox's turn is bounded: one whose table DDL holds
			// (VACUUM FULL, LOCK TABLE) or whose database stalls held up
			// every outbox after it, their partitions not made ahead and
			// their dead letters not told, for as long as it lasted. Its
			// deletes commit batch by batch: the next round goes on.
			each := cmp.Or(f.opts.maintainEach, maintainEachDefault)
			rctx, cancel := context.WithTimeout(ctx, each)
			if _, err := m.retention.RunOnce(rctx); err != nil {
				errs = append(errs, fmt.Errorf("retention of %s: %w", m.table, err))
			}
			cancel()
			if i < len(busy) {
				// A bound of its own: a retention that took its whole turn
				// (a backlog of old rows to delete) left the probe none.
				pctx, cancel := context.WithTimeout(ctx, each)
				if _, err := m.probe.RunOnce(pctx); err != nil {
					errs = append(errs, fmt.Errorf("dead-letter probe of %s: %w", m.table, err))
					m.touched.Store(true) // probed again next round
				}
				cancel()
			}
		}
		return errors.Join(errs...)
	})
}

// States reports how each outbox stands, for its per-outbox series
// (metrics.RegisterOutboxes).
func (f *Fleet) States() []metrics.OutboxState { return states(f.adminOutboxes()) }

// Backlogs reads the backlogs of the outboxes named, for their per-outbox
// series (metrics.RegisterOutboxes).
func (f *Fleet) Backlogs(ctx context.Context, names []string) (map[string]metrics.Backlog, error) {
	return backlogs(ctx, f.opts.Sweeper.Table.Name, f.adminOutboxes(), names, &f.backlogWarning, f.opts.Logger)
}

// backlogWarning logs a failure to read the backlogs for the per-outbox
// series at most once a minute while it lasts: the series, read at every
// scrape, would repeat it four times a minute, and only the log says why
// they are missing or stuck at a capped count. One for all databases: a
// second database failing within the minute of the first is told at the
// next line, a minute later at most (each error names its database).
type backlogWarning struct {
	mu     sync.Mutex
	logged time.Time
}

func (w *backlogWarning) warn(logger *slog.Logger, err error) {
	if errors.Is(err, context.Canceled) {
		return // the caller gave up (shutting down); a scrape's timeout is told
	}
	w.mu.Lock()
	due := time.Since(w.logged) >= time.Minute
	if due {
		w.logged = time.Now()
	}
	w.mu.Unlock()
	if due {
		logger.Warn(fmt.Sprintf("reading the outboxes' backlogs for their series failed (logged once a minute while it lasts): "+
			"the outboxes of each database named have no outbox_tenant_backlog_messages and outbox_tenant_oldest_message_age_seconds "+
			"series, or a backlog capped at %d where only Postgres's estimate could not be read, and their oldest rows are left out of "+
			"outbox_oldest_outstanding_age_seconds; relaying is not affected", admin.FleetBacklogCounted+1), "err", err)
	}
}

// backlogs reads the backlogs of those of outboxes named; a failure is
// logged through warning.
func backlogs(ctx context.Context, tableName string, outboxes []admin.FleetOutbox, names []string,
	warning *backlogWarning, logger *slog.Logger) (map[string]metrics.Backlog, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	outboxes = slices.DeleteFunc(outboxes, func(o admin.FleetOutbox) bool { return !want[o.PathName()] })
	read, err := admin.FleetBacklogs(ctx, tableName, outboxes) // what it read, beside a database that failed
	if err != nil {
		warning.warn(logger, err)
	}
	out := make(map[string]metrics.Backlog, len(read))
	for name, b := range read {
		out[name] = metrics.Backlog{Rows: b.Rows, OldestAgeSeconds: b.OldestAgeSeconds}
	}
	return out, err
}

// states reads each outbox's state from its admin API's parts.
func states(outboxes []admin.FleetOutbox) []metrics.OutboxState {
	out := make([]metrics.OutboxState, 0, len(outboxes))
	for _, o := range outboxes {
		t := o.Trouble()
		out = append(out, metrics.OutboxState{Name: t.Name, Tripped: t.TrippedTopics, SweepsFailing: t.SweepsFailing, Parked: o.Parked,
			Behind: o.Behind})
	}
	return out
}

// adminOutboxes lists the outboxes for the admin API, each with its parts.
func (f *Fleet) adminOutboxes() []admin.FleetOutbox {
	f.mu.Lock()
	members := slices.Collect(maps.Values(f.members))
	f.mu.Unlock()
	out := make([]admin.FleetOutbox, 0, len(members))
	for _, m := range members {
		s := m.sweeper
		cfg := f.opts.Admin
		cfg.Logger = cfg.Logger.With("outbox", m.table.String())
		cfg.Pool, cfg.Table, cfg.Database = f.pool, m.table, f.opts.Database
		cfg.Topics, cfg.Gate, cfg.DeadLetters = s.TopicBreaker(), s, m.dead
		cfg.Backoffs, cfg.Activity, cfg.SweepsFailing = s.TopicBackoffs, s.TopicActivity, s.Failing
		cfg.Stalled = func(now time.Time) (outbox.Stall, bool) { return s.Stalled(now, f.opts.StallTicks) }
		o := admin.FleetOutbox{Config: cfg, Parked: s.Asleep(), Behind: s.Behind(time.Now()), Database: f.opts.Database}
		if f.opts.Database != "" {
			o.Name = m.name
		}
		out = append(out, o)
	}
	return out
}

// unfinishedError says an outbox is not ready to relay yet (its migration
// has not finished, or its history table is missing): it is looked at again
// at each listing.
type unfinishedError struct{ err error }

func (e *unfinishedError) Error() string { return e.err.Error() }
func (e *unfinishedError) Unwrap() error { return e.err }

// SessionObserver is told of a fleet's LISTEN session (Options.Session).
type SessionObserver interface {
	// Listening is called with true each time the session listens, with
	// false each time it is lost.
	Listening(up bool)
	// Forget is called once the session has ended for good (the fleet
	// stopped, its database taken off the list): it no longer counts.
	Forget()
}

// member is one outbox of the fleet, and the outbox.Host its sweeper runs in.
type member struct {
	fleet     *Fleet
	table     outbox.Table
	name      string // in the admin API and in alerts
	sweeper   *outbox.Sweeper
	retention *outbox.Retention
	probe     *outbox.Probe
	dead      *outbox.DeadLetters
	wake      chan struct{}
	awake     outbox.AwakeLock
	stop      context.CancelFunc
	stopped   chan struct{} // closed once its sweeper's Run has returned
	// touched says a sweep moved rows since the last maintenance of the
	// outbox; maintained is when that was (maintain's goroutine alone).
	touched atomic.Bool
	// resumed says the sweep's turn is a resuming one (turns).
	resumed    atomic.Bool
	maintained time.Time
	// notes counts the outbox's notifications; the rest are Busy's, its
	// sweeper's goroutine's alone: the rows its sweeps sent, both counts at
	// the last reading of the rates, the rates, and whether Busy last said
	// the tenant was busy.
	notes     atomic.Int64
	rows      int64
	rateAt    time.Time
	rateNotes int64
	rateRows  int64
	noteRate  float64
	rowRate   float64
	kept      bool
	// inserted is the outbox table's insert count at the last
	// reconciliation that found it parked, counted whether there was one
	// (under the fleet's mu).
	inserted int64
	counted  bool
	// listedOID is the table's oid as the last listing or reconciliation
	// read it (under the fleet's mu).
	listedOID int64
}

func (m *member) signal() {
	select {
	case m.wake <- struct{}{}:
	default: // a sweep is already due
	}
}

func (m *member) Wake() <-chan struct{} { return m.wake }

// AwakeLock is the outbox's awake lock, on the fleet's LISTEN session: a
// tenant whose commits come faster than its sweeps holds it while it sweeps
// on, and its commits stop notifying (outbox.AwakeHost).
func (m *member) AwakeLock() outbox.AwakeLock { return m.awake }

// Busy reports whether the outbox's commits come at AwakeRate or more, for
// its sweeper to wake up, or at half of it, for an awake one to stay so: the
// gap keeps a tenant at about AwakeRate from taking and letting go of its
// lock over and over. Each rate is read over the last tenth of a second at
// least that its sweeper asked: asleep, from the notifications, one a
// commit; awake, when commits do not notify, from the rows its sweeps sent
// (dispatched), at least one a commit. Sweeps would not do: a sweep finds
// every commit since the last, and one that takes longer than two
// AwakeRate-ths of a second (a slow broker, a wait for a turn, a drain's
// pages) would read a tenant at any rate as slow. Rows read a trickle of
// large transactions as busy, which costs only polling. A burst after a
// quiet spell keeps it asleep for a tenth of a second.
//
// Staying awake takes either rate: the rates last read may be of a tenth of
// a second when the sweeper was asleep (it woke up on their notifications;
// its slow sweeps had sent fewer rows than were committed), and by the time
// they are read again, commits have stopped notifying. Judged on the rows
// alone, that first tenth would put a tenant it has just woken up back to
// sleep while its rows pour in.
func (m *member) Busy(dispatched int) bool { return m.busy(time.Now(), dispatched) }

func (m *member) busy(now time.Time, dispatched int) bool {
	m.rows += int64(dispatched)
	n := m.notes.Load()
	if d := now.Sub(m.rateAt); d >= 100*time.Millisecond {
		m.noteRate = float64(n-m.rateNotes) / d.Seconds()
		m.rowRate = float64(m.rows-m.rateRows) / d.Seconds()
		m.rateAt, m.rateNotes, m.rateRows = now, n, m.rows
	}
	if m.kept {
		m.kept = max(m.noteRate, m.rowRate) >= m.fleet.opts.AwakeRate/2
	} else {
		m.kept = m.noteRate >= m.fleet.opts.AwakeRate
	}
	return m.kept
}

var _ outbox.AwakeHost = (*member)(nil)

func (m *member) Take(ctx context.Context, resume bool) (func(outbox.SweepResult), error) {
	if err := m.fleet.turns.take(ctx, resume); err != nil {
		return nil, err
	}
	m.resumed.Store(resume)
	return func(res outbox.SweepResult) { m.done(resume, res) }, nil
}

// done ends a sweep's turn. Only a sweep that moved rows makes the outbox's
// maintenance due: the sweeps that find nothing (every outbox's first, the
// cursor's rereads after it, a reconciliation's false alarm) would otherwise
// run retention and the probe of a thousand idle tenants at once.
func (m *member) done(resume bool, res outbox.SweepResult) {
	m.fleet.turns.swept(resume, res.Dispatched, res.More())
	m.fleet.turns.release(resume)
	if res.Dispatched > 0 || res.DeadLettered > 0 || res.FailedBatches > 0 {
		m.touched.Store(true)
	}
}

func (m *member) Waiting() bool { return m.fleet.turns.busy(m.resumed.Load()) }

// DeadLetteredAside makes the outbox's maintenance due, its probe with it,
// for rows its sweeper dead-lettered outside a sweep (outbox.AsideHost).
func (m *member) DeadLetteredAside(int) { m.touched.Store(true) }

// PageLimit keeps a drain's pages short while quiet outboxes sweep (turns).
func (m *member) PageLimit() int { return m.fleet.turns.pageLimit() }

var (
	_ outbox.PagingHost = (*member)(nil)
	_ outbox.AsideHost  = (*member)(nil)
)

// Gone lists the schemas again at once: the outbox's sweep found its table
// dropped, and the listing stops its sweeper (outbox.ListingHost).
func (m *member) Gone() { m.fleet.listAgain() }

var _ outbox.ListingHost = (*member)(nil)
