package admin

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// FleetConfig configures the admin API of a relay of many outboxes
// (`sweeper run --schemas`, package fleet): each outbox's API, the one a
// relay of one outbox serves, under /outboxes/{schema}/, and GET /outboxes,
// which lists them, those in trouble first.
type FleetConfig struct {
	// Base is what every outbox's API shares: Addr, Token and AllowedHosts
	// (which the fleet's own routes obey too), Logger, UI, Metrics (served
	// at /metrics), Dependency, DegradedDeadLetters, StatusTopics and
	// StatusCacheFor. Its Pool serves /readyz.
	Base Config
	// TableName is the outbox table's name in every schema.
	TableName string
	// Outboxes lists the outboxes relayed now. Called on every request.
	Outboxes func() []FleetOutbox
	// Ready answers /readyz: nil when the relay is ready (a relay of many
	// databases: while any of them answers). Nil pings Base.Pool.
	Ready func(ctx context.Context) error
}

// FleetOutbox is one outbox of a fleet, as its admin API sees it.
type FleetOutbox struct {
	// Name is the outbox's name in the API's paths (/outboxes/{name}/):
	// its schema, or database.schema when the relay serves several
	// databases. Empty means the schema.
	Name string
	// Database names its database when the relay serves several; else "".
	Database string
	// Config is the outbox's API: Base with the outbox's parts (Table,
	// Topics, Gate, DeadLetters, Backoffs, Activity, Stalled, SweepsFailing).
	Config Config
	// Parked says its sweeper waits for a commit: its last sweep found
	// nothing outstanding, and no sweep is under way (outbox.Sweeper.Asleep).
	Parked bool
	// Behind is how far its sweeps are behind the commits
	// (outbox.Sweeper.Behind), when it was listed.
	Behind time.Duration
}

// FleetHandler returns the admin API of a fleet.
func FleetHandler(cfg FleetConfig) http.Handler {
	base := cfg.Base
	if base.Logger == nil {
		base.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Base = base
	f := &fleetAPI{cfg: cfg, api: &api{cfg: base, hosts: newHostRule(base.Addr, base.AllowedHosts),
		elsewhere: "; this relay relays many outboxes, each one's endpoints under /outboxes/{name}/ (GET /outboxes lists the names; the sweeper commands take --outbox NAME)"},
		outboxes: map[string]*fleetMember{}}
	mux := http.NewServeMux()
	for _, r := range f.routes() {
		mux.Handle(r.pattern, r.h)
	}
	return f.api.jsonErrors(mux)
}

// routes lists every endpoint the fleet's API serves; openapi_fleet.json
// describes each, and a test holds the two to each other. The outboxes' own
// routes are the subtree /outboxes/{name}/, described by their openapi.json.
func (f *fleetAPI) routes() []route {
	base := f.cfg.Base
	rs := []route{
		{"GET /healthz", http.HandlerFunc(f.healthz)},
		{"GET /readyz", http.HandlerFunc(f.readyz)},
		{"GET /openapi.json", http.HandlerFunc(serveFleetOpenAPI)},
		{"GET /outboxes", f.api.auth(f.list)},
		{"GET /outboxes/{name}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, r.URL.EscapedPath()+"/", http.StatusMovedPermanently) // the console's files are relative to it
		})},
		{"/outboxes/{name}/", http.HandlerFunc(f.outbox)},
		// The broker breaker is one for the relay: at the root too, so that
		// `sweeper breaker trip` before planned broker work needs no tenant's
		// name (it answered 404 without --outbox).
		{"GET /breaker", f.api.auth(f.api.breakerState)},
		{"POST /breaker/trip", f.api.auth(f.api.breakerTrip)},
		{"POST /breaker/reset", f.api.auth(f.api.breakerReset)},
	}
	rs = append(rs, f.api.profiles()...)
	if base.Metrics != nil {
		rs = append(rs, route{"GET /metrics", base.Metrics})
	}
	if base.UI {
		// The list of outboxes, each linking to its own console.
		rs = append(rs, route{"GET /{$}", page("fleet.html", "text/html; charset=utf-8")},
			route{"GET /ui/fleet.js", page("fleet.js", "text/javascript; charset=utf-8")},
			route{"GET /ui/style.css", page("style.css", "text/css; charset=utf-8")})
	}
	return rs
}

//go:embed openapi_fleet.json
var fleetOpenAPI []byte

// serveFleetOpenAPI serves the fleet's OpenAPI 3.1 description; each
// outbox's API serves its own at /outboxes/{name}/openapi.json.
func serveFleetOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(fleetOpenAPI)
}

type fleetAPI struct {
	cfg FleetConfig
	api *api // the fleet's own routes' guard, token and errors

	mu       sync.Mutex
	outboxes map[string]*fleetMember // each outbox's API, made at its first request
}

// fleetMember is an outbox's API, kept for as long as the same sweeper
// (its Gate) serves the outbox: a schema dropped and made again gets a new one.
type fleetMember struct {
	gate Gate
	h    http.Handler
}

// PathName is the outbox's name in the API's paths, in alerts and in its
// series: Name, or its schema when Name is empty.
func (o FleetOutbox) PathName() string { return cmp.Or(o.Name, o.Config.Table.Schema) }

// FleetTrouble is what an outbox's sweeper knows of its trouble, without
// asking the database: what GET /outboxes sorts by, and the per-outbox
// series (metrics.RegisterOutboxes) show.
type FleetTrouble struct {
	// Name is the outbox's name in the API's paths.
	Name string
	// TrippedTopics are its tripped topics; SweepsFailing, its sweeps failed
	// in a row (0 while they succeed).
	TrippedTopics []string
	SweepsFailing int
}

// Trouble reads the outbox's trouble from its parts.
func (o FleetOutbox) Trouble() FleetTrouble {
	t := FleetTrouble{Name: o.PathName(), TrippedTopics: []string{}}
	if o.Config.Topics != nil {
		for _, ts := range o.Config.Topics.Tripped() {
			t.TrippedTopics = append(t.TrippedTopics, ts.Topic)
		}
	}
	if o.Config.SweepsFailing != nil {
		if sf, failing := o.Config.SweepsFailing(); failing {
			t.SweepsFailing = sf.Consecutive
		}
	}
	return t
}

func (f *fleetAPI) find(name string) (FleetOutbox, bool) {
	for _, o := range f.cfg.Outboxes() {
		if o.PathName() == name {
			return o, true
		}
	}
	return FleetOutbox{}, false
}

// stripOutbox serves h the path under prefix, an outbox's root. Unlike
// http.StripPrefix it does not strip the escaped form of the path by the
// prefix: a database's name that Go escapes otherwise than its link does (a
// ';', a ',') would not match it. It cuts the escaped path at the end of
// the outbox's segment instead, and keeps the rest: a topic's own escapes
// (a/b as a%2Fb in /topics/a%2Fb/trip) must reach the outbox's routes as
// one segment.
func stripOutbox(prefix string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := strings.CutPrefix(r.URL.Path, prefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		r2 := new(http.Request)
		*r2 = *r
		r2.URL = new(url.URL)
		*r2.URL = *r.URL
		r2.URL.Path, r2.URL.RawPath = p, ""
		if raw := escapedRest(r.URL.EscapedPath()); raw != "" {
			if u, err := url.PathUnescape(raw); err == nil && u == p {
				r2.URL.RawPath = raw
			}
		}
		h.ServeHTTP(w, r2)
	})
}

// escapedRest returns escaped path /outboxes/{name}/… past its name's
// segment, which holds no unescaped /: "" if it is not such a path.
func escapedRest(escaped string) string {
	rest, ok := strings.CutPrefix(escaped, "/outboxes/")
	if !ok {
		return ""
	}
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		return rest[i:]
	}
	return ""
}

// outbox serves /outboxes/{name}/… with that outbox's API.
func (f *fleetAPI) outbox(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	o, ok := f.find(name)
	f.mu.Lock()
	m := f.outboxes[name]
	if !ok {
		delete(f.outboxes, name)
	} else if m == nil || m.gate != o.Config.Gate {
		m = &fleetMember{gate: o.Config.Gate, h: stripOutbox("/outboxes/"+name, Handler(o.Config))}
		f.outboxes[name] = m
	}
	f.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, errorBody{fmt.Sprintf("no outbox %s is relayed here: GET /outboxes lists those that are "+
			"(a schema that does not match --schemas, or whose outbox is not migrated, is not)", quoteShort(name))})
		return
	}
	m.h.ServeHTTP(w, r)
}

// healthz fails while any outbox's sweep loop is stalled: a restart frees it.
func (f *fleetAPI) healthz(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	for _, o := range f.cfg.Outboxes() {
		if o.Config.Stalled == nil {
			continue
		}
		if _, stalled := o.Config.Stalled(now); stalled {
			// The outbox's own answer says why, at length.
			rec := &api{cfg: o.Config}
			rec.cfg.Logger = f.cfg.Base.Logger.With("outbox", o.Config.Table.String())
			rec.healthz(w, r)
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (f *fleetAPI) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	ready := f.cfg.Ready
	if ready == nil {
		ready = f.cfg.Base.Pool.Ping
	}
	if err := ready(ctx); err != nil {
		reason := "database unreachable"
		if f.cfg.Ready != nil {
			// A relay of many databases: none answers, or none is relayed
			// (every entry of the list left out, or the list unread).
			reason = "no listed database is relayed and answering"
		}
		f.cfg.Base.Logger.Warn("not ready: "+reason, "err", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": reason + " (see the sweeper's log)"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// fleetOutboxStatus is an outbox in GET /outboxes.
type fleetOutboxStatus struct {
	Name     string `json:"name"`
	Database string `json:"database,omitempty"`
	Schema   string `json:"schema"`
	Table    string `json:"table"`
	// Parked: its last sweep found nothing outstanding, and no sweep is
	// under way.
	Parked bool `json:"parked"`
	// Backlog counts its outstanding rows, exactly up to
	// FleetBacklogCounted, and takes Postgres's estimate above; 0 for a
	// parked outbox, whose last sweep found nothing.
	Backlog int64 `json:"backlog"`
	// BacklogEstimate and DeadLettersEstimate are Postgres's statistics
	// (live rows of the outbox and of its dead-letter table), seconds
	// behind, read for every outbox in one statement: the listing's order.
	// The backlog's is wrong for small counts (FleetBacklogCounted says
	// why); GET /outboxes/{schema}/status counts them.
	BacklogEstimate     int64 `json:"backlog_estimate"`
	DeadLettersEstimate int64 `json:"dead_letters_estimate"`
	// OldestAgeSeconds is the age of its oldest outstanding row; null when
	// it holds none, or is parked.
	OldestAgeSeconds *float64 `json:"oldest_age_seconds"`
	TrippedTopics    []string `json:"tripped_topics"`
	// SweepsFailing counts its sweeps that failed in a row (database errors).
	SweepsFailing int `json:"sweeps_failing"`
	// DatabaseUnreachable says its database did not answer this request:
	// its backlog and dead letters read 0, unknown. The others are listed
	// beside it: one tenant database down must not blank the list an
	// operator reads to find it.
	DatabaseUnreachable bool `json:"database_unreachable"`
	// Path is the root of its API, its name escaped: a database's name may
	// hold any character, a '#' or a '?' among them.
	Path   string `json:"path"`
	outbox FleetOutbox
}

// fleetListLimitDefault is how many outboxes GET /outboxes lists unless
// asked for more: those in trouble first, then the deepest backlogs.
const fleetListLimitDefault = 100

// list serves GET /outboxes[?limit=N].
func (f *fleetAPI) list(w http.ResponseWriter, r *http.Request) {
	limit := fleetListLimitDefault
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			badRequest(w, "limit %s: give a positive number of outboxes", quoteShort(s))
			return
		}
		limit = n
	}
	outboxes := f.cfg.Outboxes()
	pools := map[*pgxpool.Pool]string{} // each database's name
	for _, o := range outboxes {
		pools[o.Config.Pool] = o.Config.databaseName()
	}
	type key struct {
		pool   *pgxpool.Pool
		schema string
	}
	backlog, dead := map[key]int64{}, map[key]int64{}
	down := map[*pgxpool.Pool]bool{}
	for pool, name := range pools {
		b, d, err := estimates(r.Context(), pool, f.cfg.TableName)
		if err != nil {
			if r.Context().Err() != nil || len(down)+1 == len(pools) {
				// No database answers (a relay of one database, whose
				// only one is down): nothing to list but the outage.
				f.api.internal(w, r, onDatabase(name, err))
				return
			}
			f.cfg.Base.Logger.Warn("GET /outboxes: a database does not answer; its outboxes are listed as unreachable, the others as they are",
				"database", name, "err", err)
			down[pool] = true
			continue
		}
		for s, n := range b {
			backlog[key{pool, s}], dead[key{pool, s}] = n, d[s]
		}
	}
	list := make([]*fleetOutboxStatus, 0, len(outboxes))
	for _, o := range outboxes {
		t, k, tr := o.Config.Table, key{o.Config.Pool, o.Config.Table.Schema}, o.Trouble()
		list = append(list, &fleetOutboxStatus{Name: tr.Name, Database: o.Database, Schema: t.Schema, Table: t.String(),
			Parked: o.Parked, BacklogEstimate: backlog[k], DeadLettersEstimate: dead[k], TrippedTopics: tr.TrippedTopics,
			SweepsFailing: tr.SweepsFailing, DatabaseUnreachable: down[o.Config.Pool], Path: "/outboxes/" + url.PathEscape(tr.Name) + "/", outbox: o})
	}
	slices.SortFunc(list, func(a, b *fleetOutboxStatus) int {
		return cmp.Or(-compareBool(a.DatabaseUnreachable, b.DatabaseUnreachable), -cmp.Compare(len(a.TrippedTopics), len(b.TrippedTopics)), -cmp.Compare(a.SweepsFailing, b.SweepsFailing),
			-cmp.Compare(a.DeadLettersEstimate, b.DeadLettersEstimate), -cmp.Compare(a.BacklogEstimate, b.BacklogEstimate),
			cmp.Compare(a.Name, b.Name))
	})
	omitted := max(0, len(list)-limit)
	list = list[:min(len(list), limit)]
	// The backlogs of the listed outboxes that are sweeping are counted: the
	// estimates read a tenant with nothing outstanding as holding a row or
	// two. A parked one found nothing at its last sweep, and a commit since
	// wakes it; the console asks every few seconds for a thousand tenants,
	// which counting all would cost a statement each a hundred of them.
	var sweeping []FleetOutbox
	for _, st := range list {
		if !st.Parked && !st.DatabaseUnreachable {
			sweeping = append(sweeping, st.outbox)
		}
	}
	// Past the cap, the estimate read above. A database that stops
	// answering now leaves its outboxes uncounted, each with its estimate.
	counted, err := countBacklogs(r.Context(), f.cfg.TableName, sweeping)
	if err != nil {
		if r.Context().Err() != nil {
			f.api.internal(w, r, err)
			return
		}
		f.cfg.Base.Logger.Warn("GET /outboxes: counting backlogs failed; those outboxes show Postgres's estimate", "err", err)
	}
	for _, st := range list {
		b, ok := counted[st.outbox.PathName()]
		if !ok && !st.Parked && err != nil {
			b.Rows = st.BacklogEstimate
		}
		st.Backlog, st.OldestAgeSeconds = b.Rows, b.OldestAgeSeconds
		if b.Rows > FleetBacklogCounted {
			st.Backlog = max(b.Rows, st.BacklogEstimate)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"outboxes": list, "total": len(outboxes), "omitted": omitted})
}

// compareBool orders false before true.
func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// FleetBacklog is an outbox's backlog.
type FleetBacklog struct {
	// Rows are its outstanding rows: counted exactly up to
	// FleetBacklogCounted, Postgres's estimate above that (never less than
	// FleetBacklogCounted+1).
	Rows int64
	// OldestAgeSeconds is the age of its oldest outstanding row; nil when
	// it holds none.
	OldestAgeSeconds *float64
}

// FleetBacklogCounted is how many outstanding rows FleetBacklogs counts of an
// outbox before it takes Postgres's estimate instead: a count of a deep
// backlog at every scrape would read all of it.
//
// The estimate alone (GET /outboxes' backlog_estimate) is wrong for small
// counts, where a backlog's being 0 or 1 matters most: Postgres adds up the
// inserts and deletes each session reports, clamped at 0 after each, and the
// application's inserts and the relay's deletes come from different sessions
// at different moments. A delete reported before its insert is lost: a
// tenant with one row outstanding read as 2 until the next ANALYZE.
const FleetBacklogCounted = 10_000

// FleetBacklogs reads the backlogs of outboxes, whose table is named
// tableName in each schema, by their names: a statement for every
// fleetBacklogChunk outboxes of a database (an index probe and a count up to
// FleetBacklogCounted rows for each), and one more for the estimates if a
// count reached the cap. An outbox whose table is gone (its schema dropped
// since the fleet last listed them) is left out. The per-outbox series
// (metrics.RegisterOutboxes) read it at each scrape for the outboxes they
// show. A database that does not answer is left out with an error, and the
// others' backlogs are returned beside it: one tenant database down must not
// take the others' series (and the lag read from them) with it.
func FleetBacklogs(ctx context.Context, tableName string, outboxes []FleetOutbox) (map[string]FleetBacklog, error) {
	out, err := countBacklogs(ctx, tableName, outboxes)
	errs := []error{err}
	estimated := map[*pgxpool.Pool]map[string]int64{}
	for _, o := range outboxes {
		b, ok := out[o.PathName()]
		if !ok || b.Rows <= FleetBacklogCounted {
			continue
		}
		pool := o.Config.Pool
		if _, read := estimated[pool]; !read {
			est, _, err := estimates(ctx, pool, tableName)
			if err != nil {
				errs = append(errs, onNamedDatabase(o.Config.databaseName(), err))
			}
			estimated[pool] = est // nil when it failed: the counts stand
		}
		b.Rows = max(b.Rows, estimated[pool][o.Config.Table.Schema])
		out[o.PathName()] = b
	}
	return out, errors.Join(errs...)
}

// fleetBacklogChunk is how many outboxes one statement of countBacklogs
// asks about: planning a statement of a thousand subqueries costs more than
// running it, and it would lock a thousand tables and their indexes at once.
const fleetBacklogChunk = 100

// countBacklogs is FleetBacklogs without the estimates: a backlog past the
// cap reads FleetBacklogCounted+1. The databases are asked at once, each on
// one connection at a time: a database that hangs takes the caller's
// deadline, not the others' turn. It returns what it read with the
// failures.
func countBacklogs(ctx context.Context, tableName string, outboxes []FleetOutbox) (map[string]FleetBacklog, error) {
	byPool := map[*pgxpool.Pool][]FleetOutbox{}
	for _, o := range outboxes {
		byPool[o.Config.Pool] = append(byPool[o.Config.Pool], o)
	}
	var (
		mu   sync.Mutex
		out  = make(map[string]FleetBacklog, len(outboxes))
		errs []error
		wg   sync.WaitGroup
	)
	for pool, list := range byPool {
		wg.Go(func() {
			read := make(map[string]FleetBacklog, len(list))
			err := countPool(ctx, pool, tableName, list, read)
			mu.Lock()
			defer mu.Unlock()
			maps.Copy(out, read)
			if err != nil {
				errs = append(errs, onNamedDatabase(list[0].Config.databaseName(), fmt.Errorf("read the outboxes' backlogs: %w", err)))
			}
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// countPool reads the backlogs of list, all in pool's database, into out: a
// statement a chunk, and one an outbox for a chunk that names a table gone.
func countPool(ctx context.Context, pool *pgxpool.Pool, tableName string, list []FleetOutbox, out map[string]FleetBacklog) error {
	for chunk := range slices.Chunk(list, fleetBacklogChunk) {
		err := countChunk(ctx, pool, tableName, chunk, out)
		if undefinedTable(err) {
			// A table is gone, which fails the whole statement: the
			// others are asked one by one.
			err = nil
			for _, o := range chunk {
				if err = countChunk(ctx, pool, tableName, []FleetOutbox{o}, out); undefinedTable(err) {
					err = nil
				} else if err != nil {
					break
				}
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func undefinedTable(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == "42P01"
}

// countChunk reads the backlogs of list, all in pool's database, into out,
// in one statement.
func countChunk(ctx context.Context, pool *pgxpool.Pool, tableName string, list []FleetOutbox, out map[string]FleetBacklog) error {
	var q strings.Builder
	for i, o := range list {
		if i > 0 {
			q.WriteString(" UNION ALL ")
		}
		t := pgx.Identifier{o.Config.Table.Schema, tableName}.Sanitize()
		fmt.Fprintf(&q, `SELECT %d, (SELECT count(*) FROM (SELECT FROM %s WHERE dispatched_at IS NULL LIMIT %d) c),
			(SELECT extract(epoch FROM now() - created_at)::float8 FROM %s WHERE dispatched_at IS NULL ORDER BY id LIMIT 1)`,
			i, t, FleetBacklogCounted+1, t)
	}
	// Simple protocol: the text changes with the outboxes shown, so
	// preparing it would only add a round trip and a statement kept.
	rows, err := pool.Query(ctx, q.String(), pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return err
	}
	var i int
	var n int64
	var age *float64
	_, err = pgx.ForEachRow(rows, []any{&i, &n, &age}, func() error {
		b := FleetBacklog{Rows: n}
		if age != nil {
			a := max(*age, 0)
			b.OldestAgeSeconds = &a
		}
		out[list[i].PathName()] = b
		return nil
	})
	return err
}

// estimates reads every outbox's and dead-letter table's live rows from
// Postgres's statistics, in one statement, by schema.
func estimates(ctx context.Context, pool *pgxpool.Pool, tableName string) (backlog, dead map[string]int64, err error) {
	rows, err := pool.Query(ctx, `SELECT n.nspname, pg_catalog.pg_stat_get_live_tuples(o.oid),
		       coalesce(pg_catalog.pg_stat_get_live_tuples(d.oid), 0)
		FROM pg_catalog.pg_class o JOIN pg_catalog.pg_namespace n ON n.oid = o.relnamespace
		LEFT JOIN pg_catalog.pg_class d ON d.relnamespace = o.relnamespace AND d.relname = $2
		WHERE o.relname = $1 AND o.relkind IN ('r', 'p')`, tableName, tableName+"_dead_letter")
	if err != nil {
		return nil, nil, fmt.Errorf("read the outboxes' row estimates: %w", err)
	}
	backlog, dead = map[string]int64{}, map[string]int64{}
	var schema string
	var b, d int64
	_, err = pgx.ForEachRow(rows, []any{&schema, &b, &d}, func() error {
		backlog[schema], dead[schema] = b, d
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read the outboxes' row estimates: %w", err)
	}
	return backlog, dead, nil
}

// StartFleet serves the admin API of a fleet on cfg.Base.Addr until ctx is
// done, as Start does for one outbox.
func StartFleet(ctx context.Context, cfg FleetConfig) (wait func(), err error) {
	return serve(ctx, cfg.Base, FleetHandler(cfg))
}
